"""Models that differ from one float model in a node or two, saved without copying its weights each time.

The INT8 search ranks the quantized nodes by quantizing each one alone (:func:`edgedeploy.precision.fallback.
layer_sensitivity`): one model per node, each holding every other node's float weights. Copied into each, on
the ResNet-50 embedder (jetson-orin) that is 87 models of about 100 MB: writing them took 16.9 s and copying the
weights 5.0 s of a 46 s ranking. Here the float model's initializers are written once, to one file
beside those models, and each model's float initializers become ONNX external-data references into it (the same
bytes: ONNX Runtime reads them back, so the model computes exactly what the inline one does). Only tensors equal
to the float model's, byte for byte, are referenced; the quantized node's own tensors stay inline.

Domain layer: onnx protos only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ALIGN = 4096  # offsets of large tensors: page-aligned, so ONNX Runtime may map them instead of reading
MIN_BYTES = 1024  # smaller tensors stay inline (as onnx's own external-data threshold)
FLOAT_SUFFIX = "__float"  # float_subset.keep_float's name for a float copy of a name taken in the Q/DQ model


class SharedWeights:
    """The float model's initializers of :data:`MIN_BYTES` or more, written once to ``folder / name``; models
    saved in ``folder`` can reference them (:meth:`externalize`)."""

    def __init__(self, float_model: Any, folder: Path, name: str = "float_weights.bin") -> None:
        self.path = folder / name
        self.location = name
        self._float = {i.name: i for i in float_model.graph.initializer if _raw(i) and len(i.raw_data) >= MIN_BYTES}
        self._where: dict[str, tuple[int, int]] = {}
        offset = 0
        with open(self.path, "wb") as out:
            for name_, init in self._float.items():
                offset += -offset % ALIGN
                out.seek(offset)
                out.write(init.raw_data)
                self._where[name_] = (offset, len(init.raw_data))
                offset += len(init.raw_data)

    def externalize(self, model: Any) -> int:
        """Turn every initializer of ``model`` that equals a float initializer of the same name (or that name
        with :data:`FLOAT_SUFFIX`) into a reference into :attr:`path`, in place. ``model`` must be saved in the
        folder of :attr:`path`. Returns the bytes no longer held inline."""
        from onnx import StringStringEntryProto, TensorProto

        moved = 0
        for init in model.graph.initializer:
            source = self._float.get(init.name) or self._float.get(init.name.removesuffix(FLOAT_SUFFIX))
            if source is None or not _raw(init) or not _same_tensor(init, source):
                continue
            offset, length = self._where[source.name]
            init.ClearField("raw_data")
            init.data_location = TensorProto.EXTERNAL
            del init.external_data[:]
            for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(length))):
                init.external_data.append(StringStringEntryProto(key=key, value=value))
            moved += length
        return moved


def _raw(init: Any) -> bool:
    from onnx import TensorProto

    return init.data_location != TensorProto.EXTERNAL and init.HasField("raw_data")


def _same_tensor(a: Any, b: Any) -> bool:
    return a.data_type == b.data_type and list(a.dims) == list(b.dims) and a.raw_data == b.raw_data
