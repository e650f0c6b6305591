"""Torch helpers shared by capture, export, goldens and validation: argument packing, output
flattening, the user's frame in a traceback, quiet exporters, an exporter error's root cause."""

from __future__ import annotations

import logging
import traceback
from typing import Any

import numpy as np

from edgedeploy.modelio.tracing import user_frame  # the user's frame: outside installed packages


def torch_args(cfg: Any, feeds: dict[str, np.ndarray]) -> tuple[Any, ...]:
    """The model's positional arguments (config input order) as torch tensors of their own: a model that changes
    its input in place (``x.mul_(2)``) leaves the feed as it was for every other run compared with it."""
    import torch

    return tuple(torch.from_numpy(np.array(feeds[s.name], order="C", copy=True)) for s in cfg.inputs)


def outputs_as_numpy(cfg: Any, result: Any) -> dict[str, np.ndarray]:
    """Model outputs (nested tuples / dicts) flattened onto the configured output names."""
    flat = flatten(result)
    return {name: t.detach().cpu().numpy() for name, t in zip(cfg.outputs, flat)}


def root_cause(exc: BaseException, limit: int = 600) -> str:
    """The innermost cause of an exporter error in one line, with the user's ``file:line`` when known.

    torch.onnx wraps torch.export's error (which names the specialised dim or the data-dependent
    guard) in a generic "step 1/3" message; the wrapped one is what the user needs.
    """
    import re

    inner = exc
    while (inner.__cause__ or inner.__context__) is not None and len(str(inner.__cause__ or inner.__context__)) > 0:
        inner = inner.__cause__ or inner.__context__  # type: ignore[assignment]
    where = user_frame(traceback.extract_tb(inner.__traceback__)) if inner.__traceback__ else None
    text = re.sub(r"\x1b\[[0-9;]*m", "", " ".join(str(inner).split()))
    return f"{type(inner).__name__}{f' at {where}' if where else ''}: {text[:limit]}"


class quiet_torch:
    """Silence torch.export / the dynamo exporter's progress lines and graph dumps (stdout, stderr, logger)."""

    def __enter__(self) -> None:
        import contextlib
        import io

        self._log = logging.getLogger("torch.onnx")
        self._level = self._log.level
        self._log.setLevel(logging.ERROR)
        self._out = contextlib.redirect_stdout(io.StringIO())
        self._err = contextlib.redirect_stderr(io.StringIO())
        self._out.__enter__()
        self._err.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._err.__exit__(*exc)
        self._out.__exit__(*exc)
        self._log.setLevel(self._level)


def flatten(result: Any) -> list[Any]:
    """Nested tuples / lists / dicts of tensors → a flat list, in order."""
    if isinstance(result, (list, tuple)):
        return [t for r in result for t in flatten(r)]
    if isinstance(result, dict):
        return [t for v in result.values() for t in flatten(v)]
    return [result]
