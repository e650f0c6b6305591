"""Keep library chatter out of the console: one line per stage, the rest in ``OUT/build.log``.

While a stage runs, Python warnings, ``logging`` records and whatever libraries print to
stdout / stderr are collected instead of shown (converter notices, exporter progress, deprecation
warnings), and so is what native code writes to file descriptors 1 and 2 (ONNX Runtime's coloured
``Removing initializer ...`` warnings, TensorRT's and PyTorch's C++ messages), with its ANSI colours
removed; the runner counts them on the stage's line and writes them to ``build.log``.
``verbose`` lets everything through as it happens.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import logging
import os
import sys
import tempfile
import warnings
from typing import Any

BUILD_LOG = "build.log"


class _Records(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(f"{record.levelname} {record.name}: {record.getMessage()}")


class _NativeOutput:
    """Redirects file descriptors 1 and 2 into a temporary file (what C/C++ libraries write bypasses sys.stdout)."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryFile()
        self._saved: dict[int, int] = {}

    def __enter__(self) -> _NativeOutput:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                if stream is not None:
                    stream.flush()
        for fd in (1, 2):
            try:
                self._saved[fd] = os.dup(fd)
            except OSError:  # closed (a daemon): nothing to redirect
                continue
            os.dup2(self._tmp.fileno(), fd)
        self._faulthandler = faulthandler.is_enabled()
        if 2 in self._saved:  # a crash in native code must still reach the user, not a file that dies with us
            faulthandler.enable(file=self._saved[2])
        return self

    def __exit__(self, *exc: Any) -> None:
        _flush_c_stdio()  # printf output still in libc's buffer belongs to this stage
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
        if 2 in self._saved:
            if self._faulthandler:
                faulthandler.enable(file=2)
            else:
                faulthandler.disable()
        for saved in self._saved.values():
            os.close(saved)
        self._saved.clear()

    def lines(self) -> list[str]:
        from edgedeploy.pipeline.progress import plain

        self._tmp.seek(0)
        text = self._tmp.read().decode("utf-8", errors="replace")
        self._tmp.close()
        return [plain(line).rstrip() for line in text.splitlines() if plain(line).strip()]


def _flush_c_stdio() -> None:
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)


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
        self._native = self._stack.enter_context(_NativeOutput())
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
        self.lines.extend(self._native.lines())

    def summary(self) -> str:
        """``N library messages in build.log`` or empty."""
        n = len(self.lines)
        return f"{n} library message{'s' if n != 1 else ''} in {BUILD_LOG}" if n else ""
