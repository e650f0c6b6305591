"""The ``deploy`` command line. Subcommands live in ``edgedeploy.commands`` (one module each).

DeployErrors become one line on stderr and their documented exit code; any other
exception keeps its traceback (exit 1). A mistyped flag or subcommand gets the closest real one.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import pkgutil
import re
import sys
import typing
from collections.abc import Sequence
from typing import Any

from edgedeploy._version import __version__
from edgedeploy.errors import EXIT_CODES, DeployError


class DeployArgumentParser(argparse.ArgumentParser):
    """argparse with did-you-mean: an unknown subcommand or flag is answered with the closest one."""

    def error(self, message: str) -> typing.NoReturn:
        match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if match:
            choices = re.findall(r"'([^']+)'", match.group(2)) or [c.strip() for c in match.group(2).split(",")]
            close = difflib.get_close_matches(match.group(1), choices, n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        super().error(message)


def _options(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of ``parser`` and of its subcommands (``deploy cache prune --max-size``)."""
    found: list[str] = []
    for action in parser._actions:
        found += [o for o in action.option_strings if o.startswith("--")]
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _options(sub)
    return found


def unknown_flag_message(parser: argparse.ArgumentParser, command: str | None, extras: list[str]) -> str:
    """One line for arguments no option took: the first unknown flag and the closest flag of ``command``."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    scope = sub.choices[command] if sub is not None and command in sub.choices else parser
    prog = scope.prog
    flag = next((e for e in extras if e.startswith("-")), None)
    if flag is None:
        return f"{prog}: unexpected argument(s): {' '.join(extras)} -- fix: see {prog} --help"
    name = flag.split("=", 1)[0]
    options = list(dict.fromkeys(_options(scope)))
    if sub is not None and scope is not parser:
        elsewhere = [p.prog for c, p in sub.choices.items() if c != command and name in _options(p)]
        if elsewhere:  # a real flag of another command (deploy check --factory): say whose, not a look-alike
            owners = " and ".join(dict.fromkeys(elsewhere))
            return f"{prog}: unknown flag {name}: it is a flag of {owners} -- fix: see {prog} --help"
    # compared without the dashes every flag shares, which alone make unrelated flags look alike
    bare = {o.lstrip("-"): o for o in options}
    close = difflib.get_close_matches(name.lstrip("-"), list(bare), n=1, cutoff=0.7)
    fix = f"did you mean {bare[close[0]]}?" if close else f"see {prog} --help"
    return f"{prog}: unknown flag {name} -- fix: {fix}"


def build_parser() -> argparse.ArgumentParser:
    parser = DeployArgumentParser(
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
    from edgedeploy.pipeline.threads import bounded_blas_waits

    bounded_blas_waits()  # before any command imports numpy: OpenBLAS reads it once, when it loads
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        print(unknown_flag_message(parser, getattr(args, "command", None), extras), file=sys.stderr)
        return 2
    previous = _stop_on_sigterm()
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # here, not at interpreter exit, so a reader gone early is caught below
        return code
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe (a subprocess, a socket) broke: an unexpected error keeps its traceback
        _quiet_stdout()
        return EXIT_STDOUT_CLOSED
    except DeployError as exc:
        print(f"deploy: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except Terminated:
        print("deploy: terminated (SIGTERM); the previous output is left as it was", file=sys.stderr)
        return 128 + 15
    except KeyboardInterrupt:
        print("deploy: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            import signal

            signal.signal(signal.SIGTERM, previous)


# what a shell reports for a process killed by SIGPIPE (128 + 13), as `yes | head -1` gives: the reader of
# stdout stopped reading (`deploy targets | head -3`), which is no error of the command's
EXIT_STDOUT_CLOSED = 141


def _stdout_closed() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has gone; True where that cannot be asked (no poll)."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return True  # stdout replaced by something without a descriptor: the error can only be its own
    if not hasattr(select, "poll"):
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))


def _quiet_stdout() -> None:
    """Point stdout at the null device, so the interpreter's final flush of what is still buffered for the gone
    reader does not print a second BrokenPipeError on the way out."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass  # no descriptor to redirect: nothing will be flushed to it either


class Terminated(KeyboardInterrupt):
    """SIGTERM (``docker stop``, a cancelled CI job) as an interrupt: the build unwinds as on Ctrl-C, its staging
    folder removed and the previous output untouched, instead of dying where it stands."""


def _stop_on_sigterm() -> Any:
    """Make SIGTERM raise :class:`Terminated` in this (main) thread; the handler it replaced, or None where
    signals cannot be handled here (another thread)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(_signum: int, _frame: Any) -> None:
        raise Terminated

    return signal.signal(signal.SIGTERM, stop)
