"""The ``deploy`` command line. Subcommands live in ``edgedeploy.commands`` (one module each).

DeployErrors become one line on stderr and their documented exit code; any other
exception keeps its traceback (exit 1).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from edgedeploy._version import __version__
from edgedeploy.errors import EXIT_CODES, DeployError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deploy",
        description="PyTorch checkpoint → validated inference artifact (ONNX Runtime / TensorRT).",
        epilog="exit codes: " + "; ".join(f"{k} {v}" for k, v in sorted(EXIT_CODES.items())),
    )
    parser.add_argument("--version", action="version", version=f"edgedeploy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    import edgedeploy.commands as commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"edgedeploy.commands.{info.name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``deploy`` and ``python -m edgedeploy``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except DeployError as exc:
        print(f"deploy: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("deploy: interrupted", file=sys.stderr)
        return 130
