"""Keep library chatter out of the console: one line per stage, the rest in ``OUT/build.log``.

While a stage runs, Python warnings, ``logging`` records and whatever libraries print to
stdout / stderr are collected instead of shown (converter notices, exporter progress, deprecation
warnings); the runner counts them on the stage's line and writes them to ``build.log``.
``verbose`` lets everything through as it happens.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from typing import Any

BUILD_LOG = "build.log"


class _Records(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(f"{record.levelname} {record.name}: {record.getMessage()}")


class StageNoise:
    """Context manager collecting one stage's library output as lines (nothing collected when ``verbose``)."""

    def __init__(self, stage: str, verbose: bool = False) -> None:
        self.stage = stage
        self.verbose = verbose
        self.lines: list[str] = []
        self._stack: Any = None

    def __enter__(self) -> StageNoise:
        if self.verbose:
            return self
        self._stack = contextlib.ExitStack()
        caught = self._stack.enter_context(warnings.catch_warnings(record=True))
        self._caught = caught
        self._out, self._err = io.StringIO(), io.StringIO()
        self._stack.enter_context(contextlib.redirect_stdout(self._out))
        self._stack.enter_context(contextlib.redirect_stderr(self._err))
        handler = _Records(self.lines)
        root = logging.getLogger()
        root.addHandler(handler)
        self._stack.callback(root.removeHandler, handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stack is None:
            return
        self._stack.close()
        for w in self._caught:
            self.lines.append(f"{w.category.__name__} {w.filename}:{w.lineno}: {w.message}")
        for stream in (self._out, self._err):
            self.lines.extend(line for line in stream.getvalue().splitlines() if line.strip())

    def summary(self) -> str:
        """``N library messages in build.log`` or empty."""
        n = len(self.lines)
        return f"{n} library message{'s' if n != 1 else ''} in {BUILD_LOG}" if n else ""
