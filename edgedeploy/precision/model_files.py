"""One parse and one write of a Q/DQ model while the quantizer's rewrites run on it, not one of each per rewrite.

Each rewrite of a quantized model (the float nodes' inputs, the TensorRT placement, the float graph outputs, the
bias corrections, the integer clip bounds, the unread initializers) is a function over a model file, usable on
its own. Run one after another on one file, each parsed and wrote the whole model again: on EfficientNet-Lite0's
jetson-orin INT8 search (74 quantized models) that was 9 s of parsing and writing. Inside :func:`held` the
rewrites share one in-memory model: :func:`load` hands out that model, :func:`save` marks it changed, and the
file is written once, when the block ends; a measurement that builds its own graph
on the model works on a copy (:func:`copy_of`). The float model the rewrites only read is parsed once per block,
or once per quantizer when it hands each block the same cache (:func:`read_only`).

Outside a block :func:`load` and :func:`save` are ``onnx.load`` and ``onnx.save``. A rewrite that changes the
model it loaded must save it (each one here changes a model only when it saves it), so the held model is
always what the file would have held.

Domain layer: onnx only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Held:
    """The model file a block holds: its in-memory model once loaded, whether it changed, read-only parses."""

    path: str
    model: Any = None
    changed: bool = False
    read_only: dict[tuple[str, int, int], Any] = field(default_factory=dict)

    def flush(self) -> None:
        """Write the held model to its file when it changed (the block's end)."""
        if self.changed and self.model is not None:
            import onnx

            onnx.save(self.model, self.path)
            self.changed = False


_HELD: ContextVar[Held | None] = ContextVar("edgedeploy_held_model_file", default=None)


def _key(path: str | Path) -> str:
    return os.fspath(Path(path).absolute())


@contextmanager
def held(path: str | Path, read_cache: dict[Any, Any] | None = None) -> Iterator[Held]:
    """Within the block, :func:`load` and :func:`save` of ``path`` share one in-memory model, written to ``path``
    once when the block ends normally (not when it raises: the try fails and its file is not used).
    ``read_cache``: where :func:`read_only` keeps its parses (a dict the caller keeps across blocks)."""
    block = Held(_key(path)) if read_cache is None else Held(_key(path), read_only=read_cache)
    token = _HELD.set(block)
    try:
        yield block
        block.flush()
    finally:
        _HELD.reset(token)


def load(path: str | Path) -> Any:
    """The model at ``path``: the held one inside a :func:`held` block for that path (parsed at most once)."""
    import onnx

    block = _HELD.get()
    if block is None or block.path != _key(path):
        return onnx.load(str(path))
    if block.model is None:
        block.model = onnx.load(block.path)
    return block.model


def save(model: Any, path: str | Path) -> None:
    """Write ``model`` to ``path``; inside a :func:`held` block for that path it becomes the held model, written
    when the block ends."""
    import onnx

    block = _HELD.get()
    if block is None or block.path != _key(path):
        onnx.save(model, str(path))
        return
    block.model, block.changed = model, True


def copy_of(path: str | Path) -> Any:
    """A model of its own to change freely (a measurement graph built on it): a copy of the held model inside a
    :func:`held` block for ``path``, else the file parsed now."""
    import onnx

    block = _HELD.get()
    if block is None or block.path != _key(path) or block.model is None:
        return onnx.load(str(path))
    copy = onnx.ModelProto()
    copy.CopyFrom(block.model)
    return copy


def read_only(path: str | Path) -> Any:
    """The model at ``path`` for reading only (never changed, never saved): inside a :func:`held` block parsed
    once per file version (size and modification time), else parsed now."""
    import onnx

    block = _HELD.get()
    if block is None:
        return onnx.load(str(path))
    stat = os.stat(path)
    key = (_key(path), stat.st_size, stat.st_mtime_ns)
    if key not in block.read_only:
        block.read_only[key] = onnx.load(str(path))
    return block.read_only[key]
