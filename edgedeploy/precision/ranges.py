"""Activation ranges for INT8, and the tensors whose range makes INT8 absurd.

A tensor's INT8 scale is ``absmax / 127`` (symmetric) or ``(hi - lo) / 255`` (asymmetric). Attention masks
are written as additive constants (``-1e4``, ``-1e9``, the dtype's ``finfo.min`` = -3.4e38, ``-inf``), so a
tensor that carries a mask has a range set by that constant, not by its data: quantized, its scale is ~1e36
and every real value in it rounds to zero. Such tensors (and any whose scale is simply huge) are found two
ways, and kept in float:

- **statically**: constants of mask magnitude that enter mask arithmetic (``Mul``/``Add``/``Sub``/``Where``/
  ``Min``/``Max``/``ConstantOfShape``), followed forward through element-wise and shape ops up to the op that
  consumes the mask (``Softmax``...). This catches masks even when the calibration data had no padding;
- **from the calibrated ranges**: a range with a non-finite value, an end at a mask constant, or an absmax
  whose INT8 step would exceed :data:`HUGE_STEP`.

Ranges come from running the FP32 model on the calibration batches with every float tensor exposed as an
output (its own shape kept, so per-channel statistics of chosen tensors are available for smoothing).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgedeploy.errors import StageError

if TYPE_CHECKING:
    from onnx import ModelProto

# |value| of the additive-mask constants in use: -1e4 (older BERT exports), -1e9 (common in hand-written
# attention), float32 / bfloat16 finfo.min (Hugging Face since 4.x), float16 finfo.min.
MASK_MAGNITUDES = (1e4, 1e9, float(np.finfo(np.float32).max), 3.3895313892515355e38, 65504.0)
MASK_SEED_MIN = 1e4  # a constant at least this large entering mask arithmetic marks a mask
HUGE_STEP = 1000.0  # INT8 step (scale) above which every value of ordinary size rounds to 0
_MASK_SEED_OPS = {"Mul", "Add", "Sub", "Where", "Min", "Max", "ConstantOfShape", "Expand"}
# ops through which a mask value travels unchanged in kind (the output still holds mask-sized values)
_MASK_CARRY_OPS = {
    "Add", "Sub", "Mul", "Div", "Neg", "Where", "Min", "Max", "Cast", "CastLike", "Expand", "Unsqueeze", "Squeeze",
    "Reshape", "Transpose", "Slice", "Concat", "Tile", "Identity", "Flatten", "Gather", "Clip",
}  # fmt: skip
_FLOAT_TYPES = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16


@dataclass
class RangeStats:
    """Range of one tensor over the calibration batches (per-channel absmax of the last axis on request)."""

    lo: float = math.inf
    hi: float = -math.inf
    nonfinite: int = 0
    channel_absmax: np.ndarray | None = field(default=None, repr=False)

    @property
    def absmax(self) -> float:
        return max(abs(self.lo), abs(self.hi)) if math.isfinite(self.lo) else 0.0

    def update(self, x: np.ndarray, *, per_channel: bool = False) -> None:
        x = np.asarray(x, dtype=np.float64)
        finite = np.isfinite(x)
        self.nonfinite += int(x.size - finite.sum())
        vals = x[finite]
        if vals.size:
            self.lo = min(self.lo, float(vals.min()))
            self.hi = max(self.hi, float(vals.max()))
        if per_channel and x.ndim:
            mag = np.abs(np.where(finite, x, 0.0)).reshape(-1, x.shape[-1]).max(axis=0)
            self.channel_absmax = mag if self.channel_absmax is None else np.maximum(self.channel_absmax, mag)


def _float_tensors(model: ModelProto) -> list[str]:
    """Names of every float tensor a node produces plus the float graph inputs (shape inference for types)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is a convenience for types here; fall back to what the graph declares
        inferred = model
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    }
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits and types.get(i.name) in _FLOAT_TYPES]
    for node in model.graph.node:
        names += [o for o in node.output if o and types.get(o) in _FLOAT_TYPES]
    return list(dict.fromkeys(names))


def collect_ranges(
    model_path: str | Path,
    batches: Sequence[dict[str, np.ndarray]],
    workdir: str | Path,
    *,
    channel_tensors: Iterable[str] = (),
) -> dict[str, RangeStats]:
    """Range of every float tensor of the model on ``batches``; per-channel absmax for ``channel_tensors``.

    Raises:
        StageError: ONNX Runtime cannot run the exposed model.
    """
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(model_path))
    names = _float_tensors(model)
    outputs = {o.name for o in model.graph.output}
    for n in names:
        if n not in outputs:
            model.graph.output.append(onnx.helper.make_empty_tensor_value_info(n))
    exposed = Path(workdir) / "ranges.exposed.onnx"
    onnx.save(model, str(exposed))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every tensor name
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(exposed), sess_options=opts, providers=["CPUExecutionProvider"])
        per_channel = set(channel_tensors)
        stats: dict[str, RangeStats] = {n: RangeStats() for n in names}
        for batch in batches:
            for n, v in zip(names, sess.run(names, batch)):
                stats[n].update(v, per_channel=n in per_channel)
    except StageError:
        raise
    except Exception as exc:  # onnxruntime raises untyped errors
        raise StageError("precision", f"range calibration failed: {' '.join(str(exc).split())[:300]}") from None
    finally:
        exposed.unlink(missing_ok=True)
    return stats


def _constants(model: ModelProto) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    out = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    out[node.output[0]] = numpy_helper.to_array(a.t)
                elif a.name in ("value_float", "value_floats"):
                    out[node.output[0]] = np.asarray(a.f if a.name == "value_float" else list(a.floats))
    return out


def _mask_sized(arr: np.ndarray) -> bool:
    if arr.dtype.kind != "f" or arr.size == 0 or arr.size > 4096:  # masks use scalars / small fills, not weights
        return False
    a = np.abs(arr.astype(np.float64))
    return bool(np.isinf(a).any() or (a >= MASK_SEED_MIN).any())


def mask_constant_tensors(model: ModelProto) -> dict[str, str]:
    """Tensors that carry an additive-mask constant, found from the graph alone (no data needed).

    Returns:
        tensor name -> why (the constant and the node that brings it in).
    """
    consts = _constants(model)
    found: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type not in _MASK_SEED_OPS:
            continue
        seeds = [consts[i] for i in node.input if i in consts and _mask_sized(consts[i])]
        if node.op_type == "ConstantOfShape":
            from onnx import numpy_helper

            seeds += [numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"]
            seeds = [s for s in seeds if _mask_sized(s)]
        if seeds:
            value = float(np.asarray(seeds[0]).ravel()[np.argmax(np.abs(np.asarray(seeds[0], np.float64).ravel()))])
            for o in node.output:
                found[o] = f"mask constant {value:.4g} enters at {node.op_type} {node.name or '?'}"
    changed = True
    while changed:  # follow the mask forward; the graph is topologically sorted, so this settles quickly
        changed = False
        for node in model.graph.node:
            if node.op_type not in _MASK_CARRY_OPS:
                continue
            src = next((i for i in node.input if i in found), None)
            if src is None:
                continue
            for o in node.output:
                if o not in found:
                    found[o] = found[src]
                    changed = True
    return found


def _mask_constant_at(value: float) -> float | None:
    a = abs(value)
    return next((m for m in MASK_MAGNITUDES if abs(a - m) <= 0.01 * m), None)


def absurd_ranges(
    stats: dict[str, RangeStats], model: ModelProto | None = None, *, huge_step: float = HUGE_STEP
) -> dict[str, dict[str, Any]]:
    """Tensors INT8 must leave in float, with their range and why.

    A tensor is absurd when its calibrated range holds a non-finite value, ends at a mask constant
    (:data:`MASK_MAGNITUDES`, within 1%), or its INT8 step ``absmax / 127`` exceeds ``huge_step``; or, with
    ``model``, when :func:`mask_constant_tensors` finds a mask constant flowing into it.
    """
    found: dict[str, dict[str, Any]] = {}
    for name, s in stats.items():
        rng = [s.lo, s.hi] if math.isfinite(s.lo) else None
        why = None
        if s.nonfinite:
            why = f"{s.nonfinite} non-finite values (-inf/inf mask)"
        elif rng is not None:
            end = max(rng, key=abs)
            mask = _mask_constant_at(end)
            step = s.absmax / 127.0
            if mask is not None and s.absmax >= MASK_SEED_MIN:
                why = f"range ends at {end:.4g}, a mask constant (INT8 step would be {step:.3g})"
            elif step > huge_step:
                why = f"INT8 step would be {step:.3g} (absmax {s.absmax:.4g}): every ordinary value rounds to 0"
        if why:
            found[name] = {"range": rng, "why": why}
    if model is not None:
        for name, why in mask_constant_tensors(model).items():
            if name not in found:
                seen = stats.get(name)
                rng = [seen.lo, seen.hi] if seen is not None and math.isfinite(seen.lo) else None
                found[name] = {
                    "range": rng,
                    "why": why + " (mask arithmetic; range on the calibration data may hide it)",
                }
    return found


def nodes_touching(tensors: Iterable[str], model: ModelProto, op_types: Iterable[str] | None = None) -> dict[str, str]:
    """Nodes that produce or read one of ``tensors`` (only ``op_types`` when given): node name -> tensor.

    Excluding these from quantization keeps the tensors in float: a QDQ quantizer quantizes a tensor only
    when a node on either side of it is quantized.
    """
    wanted = set(tensors)
    ops = set(op_types) if op_types is not None else None
    out: dict[str, str] = {}
    for node in model.graph.node:
        if ops is not None and node.op_type not in ops:
            continue
        hit = next((t for t in [*node.input, *node.output] if t in wanted), None)
        if hit is not None and node.name:
            out[node.name] = hit
    return out
