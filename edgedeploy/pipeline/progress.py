"""What a build shows while it runs: one line per stage, and what a long stage is doing now.

On a terminal, the running stage is a live line drawn with rich (spinner, ``[k/N] stage``, elapsed seconds,
and the stage's latest status, e.g. the INT8 search's ``try 5 of 13 · best top-1 0.9312 · ...``); lines a
stage logs print above it and the live line is replaced by the stage's result line when it ends. Anywhere
else (CI logs, pipes, ``TERM=dumb``) every line is a plain line: status changes print as they come, and a
stage that stays silent gets a ``still running`` line every :data:`HEARTBEAT_S` seconds.

The console writes to a duplicate of the terminal's file descriptor taken when the build starts, so the
stages' redirection of fds 1 and 2 into build.log (:mod:`edgedeploy.pipeline.quiet`) never swallows it.
``quiet`` prints nothing but warnings; ``log_file`` gets every line (and the library messages) too.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

HEARTBEAT_S = 30.0
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain(text: str) -> str:
    """``text`` without ANSI escape sequences (native libraries colour their log lines)."""
    return _ANSI.sub("", text)


def _own_stream(stream: IO[str]) -> tuple[IO[str], bool]:
    """A stream on a duplicate of ``stream``'s fd (unaffected by later dup2 onto fds 1/2), and whether it is new."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # a StringIO, pytest's capture: already not fd 2
        return stream, False
    try:
        stream.flush()
    except (OSError, ValueError):
        pass
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace"), True


def is_terminal(stream: IO[str]) -> bool:
    """True where a live line can be redrawn: a TTY, and not ``TERM=dumb``."""
    try:
        tty = stream.isatty()
    except (AttributeError, OSError, ValueError):
        return False
    return bool(tty) and os.environ.get("TERM", "") != "dumb"


class BuildConsole:
    """The build's console: permanent lines, a live status for the running stage, an optional log file."""

    def __init__(
        self,
        stream: IO[str],
        *,
        quiet: bool = False,
        live: bool | None = None,
        log_file: Path | None = None,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.stream, self._owned = _own_stream(stream)
        self.quiet = quiet
        self.live = is_terminal(stream) if live is None else live
        self.heartbeat_s = heartbeat_s
        self._log: IO[str] | None = None
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log = log_file.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._rich: Any = None  # rich.console.Console, on a terminal
        self._live: Any = None  # rich.live.Live while a stage runs
        self._stage = ""
        self._status = ""
        self._t0 = 0.0
        self._last_print = 0.0
        self._last_tick = float("-inf")

    # ---- permanent lines ------------------------------------------------------------------------------

    def line(self, text: str) -> None:
        """A permanent line (a stage result, a warning, a log line of a stage). Quiet keeps only warnings."""
        self.record(text)
        if self.quiet and "warning:" not in text:
            return
        with self._lock:
            if self._live is not None:
                self._live.console.print(text, markup=False, highlight=False, soft_wrap=True)
            else:
                print(text, file=self.stream, flush=True)
            self._last_print = time.monotonic()

    def record(self, text: str) -> None:
        """Put ``text`` in the log file only."""
        if self._log is not None:
            self._log.write(plain(text) + "\n")
            self._log.flush()

    # ---- the running stage ----------------------------------------------------------------------------

    def status(self, text: str, *, tick: bool = False) -> None:
        """What the running stage is doing now: the live line on a terminal, a plain line elsewhere (a ``tick``,
        e.g. ``batch 7 of 64``, at most once per :data:`HEARTBEAT_S` there)."""
        self._status = text
        if self._live is not None:
            self._live.update(self._render())
            return
        now = time.monotonic()
        if tick and now - self._last_tick < self.heartbeat_s:
            return
        if tick:
            self._last_tick = now
        if self.quiet:
            self.record(f"  {text}")
        else:
            self.line(f"  {text}")

    @contextlib.contextmanager
    def stage(self, index: int, total: int, name: str) -> Iterator[None]:
        """While the block runs, show ``[index/total] name`` live with its elapsed time (or heartbeats)."""
        self._stage, self._status, self._t0 = f"[{index}/{total}] {name}", "", time.monotonic()
        self._last_tick = float("-inf")
        self._last_print = self._t0
        stop = threading.Event()
        beat = None
        if self.live and not self.quiet:
            self._start_live()
        elif not self.quiet and self.heartbeat_s > 0:
            beat = threading.Thread(target=self._heartbeat, args=(stop,), daemon=True)
            beat.start()
        try:
            yield
        finally:
            stop.set()
            if beat is not None:
                beat.join()
            self._stop_live()
            self._stage = self._status = ""

    def _start_live(self) -> None:
        from rich.console import Console
        from rich.live import Live

        if self._rich is None:
            self._rich = Console(file=self.stream, force_terminal=True, highlight=False, soft_wrap=True)
        self._live = Live(
            self._render(),
            console=self._rich,
            refresh_per_second=4,
            transient=True,
            redirect_stdout=False,  # fds 1/2 go to build.log while a stage runs: the stage's own business
            redirect_stderr=False,
            get_renderable=self._render,
        )
        self._live.start()

    def _stop_live(self) -> None:
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None

    def _render(self) -> Any:
        from rich.console import Group
        from rich.spinner import Spinner
        from rich.text import Text

        seconds = time.monotonic() - self._t0
        head = Spinner("dots", text=Text(f"{self._stage}  {seconds:.0f}s", style="bold"))
        if not self._status:
            return head
        return Group(head, Text(f"  {self._status}", overflow="fold"))  # wrapped below, never cut off

    def _heartbeat(self, stop: threading.Event) -> None:
        while not stop.wait(min(self.heartbeat_s, 1.0)):
            quiet_for = time.monotonic() - self._last_print
            if quiet_for >= self.heartbeat_s:
                running = time.monotonic() - self._t0
                self.line(f"  {self._stage.split('] ', 1)[-1]} still running ({running:.0f}s)")

    def close(self) -> None:
        """Stop the live line, close the log file and the duplicated fd."""
        self._stop_live()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._owned:
            with contextlib.suppress(OSError):
                self.stream.close()
            self._owned = False
