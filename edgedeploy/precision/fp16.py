"""FP16 that keeps accuracy: find the layers whose activations leave FP16's range and keep them FP32.

How the pins reach the engine follows the target (``TargetProfile.strongly_typed_only``):
TensorRT <= 10 gets the FP32 graph plus the builder's FP16 flag and per-layer FP32 pins (``precision.json``);
TensorRT 11 (strongly typed networks, no precision flags) gets an FP16 ONNX model whose pinned nodes,
inputs and outputs stay FP32.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgedeploy.errors import StageError


def fp16_strategy(strongly_typed_only: bool) -> str:
    """``typed-onnx`` (FP16 ONNX model) for strongly typed TensorRT, else ``builder-flag`` (FP16 flag + pins)."""
    return "typed-onnx" if strongly_typed_only else "builder-flag"


def _float16_module() -> Any:
    try:
        from onnxconverter_common import float16
    except ImportError:  # the same converter ships inside onnxruntime
        from onnxruntime.transformers import float16
    return float16


def convert_fp16(model_path: Path, out: Path, *, keep_fp32: Sequence[str] = ()) -> Path:
    """Write an FP16 copy of ``model_path``: graph inputs/outputs and ``keep_fp32`` nodes stay FP32.

    Raises:
        StageError: the converter fails or ``keep_fp32`` names nodes the model does not have.
    """
    import onnx

    model = onnx.load(str(model_path))
    names = {n.name for n in model.graph.node}
    unknown = [n for n in keep_fp32 if n not in names]
    if unknown:
        raise StageError(
            "precision",
            f"nodes to keep in FP32 are not in the model: {', '.join(unknown[:5])}",
            hint="use node names from model.onnx (see precision.json)",
        )
    try:
        converted = _float16_module().convert_float_to_float16(
            model, keep_io_types=True, node_block_list=list(keep_fp32), disable_shape_infer=False
        )
    except Exception as exc:  # the converter raises assorted exception types
        raise StageError(
            "precision", f"FP16 conversion failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        ) from None
    onnx.save(converted, str(out))
    return out
