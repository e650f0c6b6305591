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
from typing import Any

from edgedeploy._version import __version__
from edgedeploy.errors import EXIT_CODES, DeployError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deploy",
        description="PyTorch checkpoint → validated inference artifact (ONNX Runtime / TensorRT).",
        epilog="exit codes: " + "; ".join(f"{k} {v}" for k, v in sorted(EXIT_CODES.items())),
    )
    parser.add_argument("--version", action="version", version=f"edgedeploy {__version__}")
    add_output_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    import edgedeploy.commands as commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"edgedeploy.commands.{info.name}")
        module.register(sub)
    for command in sub.choices.values():  # before or after the command: `deploy -q build` = `deploy build -q`
        add_output_flags(command, top=False)
    return parser


def add_output_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``-q`` / ``-v`` / ``--log-file``: on the top parser with defaults, on each command without (so a flag
    given before the command is not reset by the command's parser); an option a command defines itself wins."""
    taken = set(parser._option_string_actions)
    flags: list[tuple[tuple[str, ...], dict[str, Any]]] = [
        (("-q", "--quiet"), {"action": "store_true", "help": "print only warnings, errors and the final verdict"}),
        (("-v", "--verbose"), {"action": "store_true", "help": "show library output (native logs too) as it happens"}),
        (("--log-file",), {"metavar": "PATH", "help": "also append every progress line and library message to PATH"}),
    ]
    for names, kwargs in flags:
        if not taken.intersection(names):
            default = (None if "metavar" in kwargs else False) if top else argparse.SUPPRESS
            parser.add_argument(*names, default=default, **kwargs)


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
