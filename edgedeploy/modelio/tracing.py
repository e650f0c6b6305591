"""Where a TracerWarning comes from: the user's own code, or library code (torch, transformers, ...).

A TracerWarning means tracing froze a Python value into the graph. Raised at the user's line it
is actionable ("use x.shape[0] instead of int(...)"); raised inside nn.LSTM or transformers'
masking code it is not, and whether the frozen value matters is decided by running the trace at
other shapes. So each warning is attributed to the innermost frame that is not torch's own
machinery, and labelled ``user`` or ``library`` by where that frame's file lives.
"""

from __future__ import annotations

import functools
import linecache
import os
import re
import sys
import sysconfig
import traceback
import warnings
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TracerFinding:
    """One TracerWarning: ``where`` is ``file:line``; ``user`` is False when that line is library code."""

    where: str
    message: str
    user: bool

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def _dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(edgedeploy's own and the stdlib's folders: skipped, library folders: site-packages and torch); computed
    once per ``sys.path`` (every finding asks, and a trace may convert thousands of times)."""
    return _dirs_for(tuple(sys.path))


@functools.lru_cache(maxsize=8)
def _dirs_for(sys_path: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    import torch

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    stdlib = os.path.dirname(os.path.abspath(warnings.__file__)) + os.sep
    libs = {os.path.dirname(os.path.abspath(torch.__file__)) + os.sep}
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            libs.add(os.path.abspath(path) + os.sep)
    for entry in sys_path:
        if entry.rstrip(os.sep).endswith(("site-packages", "dist-packages")):
            libs.add(os.path.abspath(entry) + os.sep)
    return (here, stdlib), tuple(sorted(libs))


def is_library_file(filename: str) -> bool:
    """True for files of installed packages (site-packages, dist-packages, torch) and the stdlib."""
    skip, libs = _dirs()
    path = os.path.abspath(filename)
    return path.startswith(libs) or path.startswith(skip[1]) or filename.startswith("<")


def user_frame(stack: list[traceback.FrameSummary]) -> str | None:
    """``file:line`` of the innermost frame outside installed packages, the stdlib and edgedeploy, if any."""
    skip, libs = _dirs()
    for frame in reversed(stack):
        path = os.path.abspath(frame.filename)
        if not path.startswith(skip + libs) and not frame.filename.startswith("<"):
            return f"{frame.filename}:{frame.lineno}"
    return None


def attribute(stack: list[traceback.FrameSummary], filename: str, lineno: int, message: Any) -> TracerFinding:
    """Attribute one warning: the frame that raised it (``filename:lineno``) decides user vs library.

    The warning's own frame is where the Python value was frozen (``int(t)``, ``if t:``); when that
    line is in an installed package the user cannot change it, so it is a library finding, and the
    user's innermost frame (their call into the library) is named alongside for context.
    """
    text = " ".join(str(message).split())[:200]
    skip, _ = _dirs()
    origin = os.path.abspath(filename)
    if origin.startswith(skip[0]):  # raised by edgedeploy's own calls: blame the user's frame
        origin = ""
    if origin and is_library_file(filename):
        caller = user_frame(stack)
        where = f"{filename}:{lineno}" + (f" (called from {caller})" if caller else "")
        return TracerFinding(where, text, user=False)
    where = (f"{filename}:{lineno}" if origin else None) or user_frame(stack) or f"{filename}:{lineno}"
    return TracerFinding(where, text, user=True)


# int(x.shape[0]) / int(x.size(1)) / float(t.shape[-1]): a tensor size made a Python number
SIZE_AS_NUMBER = re.compile(r"\b(?:int|float)\(\s*([\w.]+(?:\.shape\s*\[[^\]]+\]|\.size\([^)]*\)))\s*\)")


# math.sqrt(x.size(-1)) / math.sqrt(q.shape[-1]): a size made a Python float by the math module
_SQRT_OF_SIZE = re.compile(r"\bmath\.sqrt\(\s*([\w.]+(?:\.shape\s*\[[^\]]+\]|\.size\([^)]*\)))\s*\)")
# a tensor size anywhere on a line
SIZE_IN_LINE = re.compile(r"\.shape\s*\[|\.size\(")


def frozen_value_fix(finding: TracerFinding) -> tuple[str, str]:
    """(the source line at ``finding.where``, the fix that keeps the value symbolic) for a user TracerWarning.

    ``int(y.shape[0])`` is a Python number, fixed at the example's size when the model is traced or exported;
    ``y.shape[0]`` itself is recorded as a size of ``y`` and follows the input. The fix names that exact rewrite
    when the line has this form, else the general rule.
    """
    file, _, line = finding.where.partition(" ")[0].rpartition(":")
    source = linecache.getline(file, int(line)).strip() if line.isdigit() else ""
    short = f"{os.path.basename(file)}:{line}"
    match = SIZE_AS_NUMBER.search(source)
    if match:
        size = match.group(1)
        return source, f"write `{size}` instead of `{match.group(0)}` at {short} (a tensor size follows the input)"
    root = _SQRT_OF_SIZE.search(source)
    if root:  # the attention scaling idiom: a power of the size stays in the graph, math.sqrt makes a float
        size = root.group(1)
        return (
            source,
            f"write `{size} ** 0.5` instead of `{root.group(0)}` at {short} (a tensor size follows the input)",
        )
    return source, (
        f"at {short} keep the value a tensor: sizes as x.shape[i] / x.size(i), values computed from tensors "
        "(a count, a maximum) as tensors, without int(...), .item() or .tolist(), which export fixes at the "
        "example's value"
    )


def is_branch(finding: TracerFinding) -> bool:
    """Whether a TracerWarning froze a branch: a tensor made a Python boolean (``if t:``, ``while t:``)."""
    return "Python boolean" in finding.message


def frozen_value_hint(finding: TracerFinding, *, accept: bool = True) -> str:
    """The fix for a user TracerWarning, by what was frozen: a branch on tensor values, or a number
    (``accept``: also name ``export.fail_on_tracer_warnings = false``, where it is not set already).

    ``if x.amax() > 100:`` (a tensor made a Python boolean) is decided once, for the example, when the model is
    traced; the graph then takes that path for every input. Tensor ops keep both paths in the graph.
    """
    file, _, line = finding.where.partition(" ")[0].rpartition(":")
    short = f"{os.path.basename(file)}:{line}"
    accept_text = (
        "; or set export.fail_on_tracer_warnings = false to accept the traced graph (checked at the probe inputs only)"
        if accept and is_branch(finding)
        else ""
    )
    if is_branch(finding):
        return (
            f"at {short} decide with tensor ops (torch.where(cond, a, b), a mask) instead of a Python if/while on "
            "a tensor's values, so the graph keeps both paths" + accept_text
        )
    return frozen_value_fix(finding)[1] + accept_text


# Tensor -> Python conversions the tracer freezes, with the first sentence of the TracerWarning torch gives for each
_CONVERSIONS = {
    "__bool__": "Converting a tensor to a Python boolean",
    "__int__": "Converting a tensor to a Python integer",
    "__float__": "Converting a tensor to a Python float",
    "__index__": "Converting a tensor to a Python index",
    "item": "Converting a tensor to a Python number",
    "tolist": "Converting a tensor to a Python list",
    "numpy": "Converting a tensor to a NumPy array",
    "__len__": "Using len to get tensor shape",
    "__iter__": "Iterating over a tensor",
}
_HERE = os.path.abspath(__file__)
_FROZEN_TAIL = " might cause the trace to be incorrect (recorded while tracing, whatever the warning filters said)"


class TracerWarnings:
    """Context manager collecting TracerWarnings (deduplicated) as :class:`TracerFinding`.

    Two witnesses: torch's TracerWarnings, and the Tensor -> Python conversions themselves (``if t:``,
    ``t.item()``, ``int(t)``...) made while a trace runs. The second does not depend on the warning filters, which
    the model's own code may set (``warnings.simplefilter("ignore")`` inside ``forward`` hides every
    TracerWarning it raises).
    """

    def __init__(self) -> None:
        self.findings: list[TracerFinding] = []
        self._ctx: Any = None
        self._patched: dict[str, Any] = {}
        self._seen: set[tuple[str, int, str]] = set()  # (file, line, kind) of the conversions recorded

    def _add(self, found: TracerFinding) -> None:
        """Keep ``found`` unless the same line froze the same kind of value already (both witnesses saw it)."""
        kind = found.message.split(" might ")[0]
        if not any(f.where == found.where and f.message.split(" might ")[0] == kind for f in self.findings):
            self.findings.append(found)

    def _watch_conversions(self, torch: Any) -> None:
        """Wrap the Tensor -> Python conversions so one made while tracing is a finding at its caller's line."""

        def watched(original: Any, what: str) -> Any:
            def converted(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                if torch._C._get_tracing_state() is not None:
                    caller = sys._getframe(1)
                    seen = (caller.f_code.co_filename, caller.f_lineno, what)
                    if seen not in self._seen:  # a loop converting at one line: its stack is read once
                        self._seen.add(seen)
                        stack = traceback.extract_stack(caller)
                        self._add(attribute(stack, caller.f_code.co_filename, caller.f_lineno, what + _FROZEN_TAIL))
                return original(tensor, *args, **kwargs)

            return converted

        for name, what in _CONVERSIONS.items():
            converted = watched(getattr(torch.Tensor, name), what)
            # restored as it was: an own attribute put back, an inherited one (TensorBase's C slot) deleted again
            self._patched[name] = vars(torch.Tensor).get(name)
            setattr(torch.Tensor, name, converted)

    @property
    def user(self) -> list[TracerFinding]:
        return [f for f in self.findings if f.user]

    @property
    def library(self) -> list[TracerFinding]:
        return [f for f in self.findings if not f.user]

    def __enter__(self) -> TracerWarnings:
        import torch

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notices are not the user's concern
        warnings.simplefilter("always", torch.jit.TracerWarning)
        previous = warnings.showwarning

        def record(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            if issubclass(category, torch.jit.TracerWarning):
                if os.path.abspath(filename) != _HERE:  # else raised inside a watched conversion: recorded there
                    self._add(attribute(traceback.extract_stack()[:-1], filename, lineno, message))
            else:
                previous(message, category, filename, lineno, file, line)

        warnings.showwarning = record
        self._watch_conversions(torch)
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        for name, own in self._patched.items():
            if own is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, own)
        self._patched.clear()
        self._ctx.__exit__(*exc)
