"""Cross-layer equalization and bias correction for INT8 (Nagel et al. 2019, "Data-Free Quantization Through
Weight Equalization and Bias Correction").

Depthwise CNNs quantize badly with per-tensor activations and even per-channel weights: BN folding leaves some
output channels of a conv with weights 100x larger than others, and the next layer's input channels inherit
that spread. For a pair ``conv1 -> act -> conv2`` where ``act`` is positively homogeneous
(``act(x / s) = act(x) / s`` for ``s > 0``), dividing conv1's output channel ``i`` by ``s_i`` and multiplying
conv2's input channel ``i`` by ``s_i`` leaves the network's function unchanged; ``s_i = sqrt(r1_i / r2_i)``
(``r`` = the channel's weight range) makes both ranges ``sqrt(r1_i * r2_i)``.

ReLU is homogeneous; ReLU6 (``Clip(0, 6)``) is not, because its upper bound does not scale. The scaled pair's
clip is therefore rewritten as ``Relu`` followed by ``Min`` with a per-channel bound ``6 / s_i``, which is exact.

Bias correction: quantizing weights shifts each conv output's mean by ``(W_q - W) E[x]``. With the per-channel
input means measured on the calibration data in the float model, the shift is subtracted from the quantized
model's bias (``E[y_q] = E[y]`` again, up to padding borders).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from onnx import ModelProto


RELU_SUFFIX = "__cle_relu"  # the Relu half of a rewritten Relu6; its Min's output keeps the Clip's name
HOMOGENEOUS = ("Relu", "Clip", "Min")  # Min: a Relu6 rewritten by an earlier sweep (per-channel bound)


@dataclass
class EqualizeReport:
    """What :func:`equalize` did (plain data for precision.json)."""

    pairs: list[tuple[str, str]] = field(default_factory=list)
    sweeps: int = 0
    clips_rewritten: int = 0
    range_spread_before: float = 0.0  # median over equalized convs of max/min per-channel weight range
    range_spread_after: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "pairs": len(self.pairs),
            "sweeps": self.sweeps,
            "clips_rewritten": self.clips_rewritten,
            "median_channel_range_spread": {
                "before": round(self.range_spread_before, 2),
                "after": round(self.range_spread_after, 2),
            },
        }


def has_depthwise_conv(model: ModelProto) -> bool:
    """True when the ONNX model has a Conv whose group equals its input channels (and is > 1)."""
    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "Conv" or len(node.input) < 2 or node.input[1] not in inits:
            continue
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if group > 1 and list(inits[node.input[1]].dims)[1] == 1:
            return True
    return False


def channel_ranges(w: np.ndarray, axis: int) -> np.ndarray:
    """Max |w| per channel along ``axis`` (the symmetric weight quantizer's per-channel range)."""
    other = tuple(a for a in range(w.ndim) if a != axis)
    return np.abs(w).max(axis=other)


def spread(r: np.ndarray) -> float:
    """max / min of per-channel ranges (dead channels, below 1e-6 of the max, ignored): 1.0 is equalized."""
    r = r[r > 1e-6 * r.max()] if r.size else r
    return float(r.max() / r.min()) if r.size else 1.0


@dataclass
class _Pair:
    conv1: Any
    act: list[Any]  # [] (identity), [Relu], [Clip], [Relu, Min]
    conv2: Any


def _group(node: Any) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1)


def _find_pairs(model: ModelProto, inits: dict[str, np.ndarray]) -> list[_Pair]:
    graph = model.graph
    consumers: dict[str, list[Any]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    uses: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    outputs = {o.name for o in graph.output}

    def only_consumer(tensor: str) -> Any | None:
        c = consumers.get(tensor, [])
        return c[0] if len(c) == 1 and tensor not in outputs else None

    def scalar(name: str) -> float | None:
        v = inits.get(name)
        return float(v) if v is not None and v.size == 1 else None

    def convertible(n: Any) -> bool:  # an activation we can keep exact under per-channel scaling
        if n.op_type == "Relu":
            return True
        if n.op_type == "Clip":
            if any(a.name in ("min", "max") for a in n.attribute):  # opset < 11: bounds are attributes
                lo = next((a.f for a in n.attribute if a.name == "min"), None)
                return lo == 0.0 and any(a.name == "max" for a in n.attribute)
            return len(n.input) == 3 and scalar(n.input[1]) == 0.0 and scalar(n.input[2]) is not None
        return False

    pairs = []
    for c1 in graph.node:
        if c1.op_type != "Conv" or len(c1.input) < 3 or c1.input[1] not in inits or c1.input[2] not in inits:
            continue
        if uses.get(c1.input[1]) != 1 or uses.get(c1.input[2]) != 1:
            continue
        channels = inits[c1.input[1]].shape[0]
        act: list[Any] = []
        t = c1.output[0]
        nxt = only_consumer(t)
        if nxt is not None and nxt.op_type in HOMOGENEOUS and nxt.op_type != "Min" and convertible(nxt):
            act.append(nxt)
            t = nxt.output[0]
            nxt = only_consumer(t)
            if act[0].op_type == "Relu" and nxt is not None and nxt.op_type == "Min":  # an earlier rewrite
                bound = inits.get(nxt.input[1])
                if bound is None or uses.get(nxt.input[1]) != 1 or bound.shape != (channels, 1, 1):
                    continue
                act.append(nxt)
                t = nxt.output[0]
                nxt = only_consumer(t)
        if nxt is None or nxt.op_type != "Conv" or nxt.input[0] != t or len(nxt.input) < 2:
            continue
        if nxt.input[1] not in inits or uses.get(nxt.input[1]) != 1:
            continue
        w2 = inits[nxt.input[1]]
        g2 = _group(nxt)
        if not ((g2 == 1 and w2.shape[1] == channels) or (g2 == channels and w2.shape == (channels, 1, *w2.shape[2:]))):
            continue
        pairs.append(_Pair(c1, act, nxt))
    return pairs


def equalize(
    model_path: Path,
    out: Path,
    *,
    max_sweeps: int = 20,
    tol: float = 1e-3,
    max_scale: float = 16.0,
    input_peaks: dict[str, np.ndarray] | None = None,
    weight_pairs: bool = True,
) -> EqualizeReport:
    """Write a cross-layer-equalized copy of the float ONNX model ``model_path`` to ``out``.

    The FP32 function is unchanged (exact up to float rounding). BN must already be folded into the convs
    (ONNX Runtime's ``quant_pre_process`` does that). Sweeps repeat until no scale moves more than ``tol``.
    Each channel's total scale stays within ``[1 / max_scale, max_scale]``: a near-dead conv1 channel (weights
    ~0, output ~ its bias) would otherwise be blown up by ``1 / s`` and set the per-tensor activation range of
    the whole layer.

    ``input_peaks`` (conv name -> per-channel max |input| on calibration data, :func:`conv_input_stats`):
    pairs whose second conv is depthwise equalize the *activation* between them instead. With per-channel
    weights both convs' weight quantization is invariant to the scale there (each channel has its own scale),
    so only the per-tensor activation quantization changes: every channel is scaled up to the largest one's
    range and gets the full 8 bits. ``weight_pairs``: the other pairs get Nagel's weight equalization.
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(model_path))
    graph = model.graph
    inits = {i.name: numpy_helper.to_array(i).copy() for i in graph.initializer}
    report = EqualizeReport()
    found = _find_pairs(model, inits)
    # plain data only: references into a protobuf repeated field do not survive edits of that field
    pairs = [
        {
            "names": (p.conv1.name, p.conv2.name),
            "w1": p.conv1.input[1],
            "b1": p.conv1.input[2],
            "w2": p.conv2.input[1],
            "depthwise2": _group(p.conv2) > 1,
            "bound": p.act[1].input[1] if len(p.act) == 2 else None,
        }
        for p in found
    ]
    # Relu6 -> Relu + Min(per-channel bound): exact under per-channel scaling
    rewrite: dict[str, list[Any]] = {}  # Clip output -> replacement nodes
    new_inits: dict[str, np.ndarray] = {}
    for p, d in zip(found, pairs):
        if p.act and p.act[0].op_type == "Clip":
            clip = p.act[0]
            channels = inits[d["w1"]].shape[0]
            if len(clip.input) == 3:
                hi = float(inits[clip.input[2]])
            else:
                hi = next(a.f for a in clip.attribute if a.name == "max")
            base = clip.name or clip.output[0]
            bound, relu_out = f"{base}__cle_bound", f"{clip.output[0]}{RELU_SUFFIX}"
            relu = helper.make_node("Relu", [clip.input[0]], [relu_out], name=f"{base}__cle_relu")
            mn = helper.make_node("Min", [relu_out, bound], [clip.output[0]], name=f"{base}__cle_min")
            new_inits[bound] = np.full((channels, 1, 1), hi, np.float32)
            rewrite[clip.output[0]] = [relu, mn]
            d["bound"] = bound
            report.clips_rewritten += 1
    if rewrite:
        nodes = []
        for n in graph.node:
            nodes.extend(rewrite.get(n.output[0], [n]) if n.op_type == "Clip" else [n])
        del graph.node[:]
        graph.node.extend(nodes)
    inits.update(new_inits)
    before = [spread(channel_ranges(inits[d["w1"]], 0)) for d in pairs]
    total = [np.ones(inits[d["w1"]].shape[0]) for d in pairs]  # accumulated scale per channel
    act_pairs = set()
    for k, d in enumerate(pairs):
        peaks = (input_peaks or {}).get(d["names"][1])
        if not d["depthwise2"] or peaks is None or not (peaks > 0).any():
            continue
        s = np.clip(peaks / peaks.max(), 1.0 / max_scale, 1.0)
        _scale_pair(inits, d, s)
        total[k] = s
        act_pairs.add(k)
    for sweep in range(max_sweeps if weight_pairs else 0):
        moved = 0.0
        for d, acc in (pt for k, pt in enumerate(zip(pairs, total)) if k not in act_pairs):
            w1, w2 = inits[d["w1"]], inits[d["w2"]]
            r1 = channel_ranges(w1, 0)
            r2 = channel_ranges(w2, 0) if d["depthwise2"] else channel_ranges(w2, 1)
            ok = (r1 > 0) & (r2 > 0)
            s = np.ones_like(r1)
            s[ok] = np.sqrt(r1[ok] / r2[ok])
            s = np.clip(acc * s, 1.0 / max_scale, max_scale) / acc
            acc *= s
            _scale_pair(inits, d, s)
            moved = max(moved, float(np.abs(np.log(s)).max()))
        report.sweeps = sweep + 1
        if moved < tol:
            break
    after = [spread(channel_ranges(inits[d["w1"]], 0)) for d in pairs]
    report.pairs = [d["names"] for d in pairs]
    if pairs:
        report.range_spread_before = float(np.median(before))
        report.range_spread_after = float(np.median(after))
    names = {i.name for i in graph.initializer}
    touched = {d[k] for d in pairs for k in ("w1", "b1", "w2", "bound") if d[k] is not None}
    for init in graph.initializer:
        if init.name in touched:
            init.CopyFrom(numpy_helper.from_array(inits[init.name].astype(np.float32, copy=False), init.name))
    for name, value in new_inits.items():
        if name not in names:
            graph.initializer.append(numpy_helper.from_array(value, name))
    onnx.save(model, str(out))
    return report


def tie_clip_ranges(ranges: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    """Give each rewritten Relu's output the range of its Min's output (the tensor the Clip produced).

    The quantizer folds the Relu into the conv's output QuantizeLinear, calibrated on the *unclipped* values;
    saturating at the Min output's range instead is exact (``min(min(x, B), b_i) = min(x, b_i)`` for
    ``B >= b_i``) and keeps the resolution the Relu6 model had.
    """
    out = dict(ranges)
    for name in ranges:
        if name.endswith(RELU_SUFFIX) and name[: -len(RELU_SUFFIX)] in ranges:
            out[name] = ranges[name[: -len(RELU_SUFFIX)]]
    return out


def _scale_pair(inits: dict[str, np.ndarray], d: dict[str, Any], s: np.ndarray) -> None:
    """conv1's output channel i (weights, bias, the activation's bound) / s_i; conv2's input channel i * s_i."""
    w1, b1, w2 = inits[d["w1"]], inits[d["b1"]], inits[d["w2"]]
    w1 /= s.reshape(-1, *[1] * (w1.ndim - 1))
    b1 /= s
    if d["depthwise2"]:
        w2 *= s.reshape(-1, *[1] * (w2.ndim - 1))
    else:
        w2 *= s.reshape(1, -1, *[1] * (w2.ndim - 2))
    if d["bound"] is not None:
        inits[d["bound"]] /= s.reshape(-1, 1, 1)


def conv_input_stats(
    model_path: Path, batches: Sequence[dict[str, np.ndarray]]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Conv node name -> (per-channel mean, per-channel max |x|) of its input over ``batches`` (the float
    model at ``model_path``, all positions)."""
    import onnx

    from edgedeploy.precision import analysis

    model = onnx.load(str(model_path))
    convs = {n.name: n.input[0] for n in model.graph.node if n.op_type == "Conv" and n.name}
    tensors = sorted(set(convs.values()))
    have = {o.name for o in model.graph.output}
    for t in tensors:
        if t not in have:
            model.graph.output.append(onnx.ValueInfoProto(name=t))
    tmp = model_path.with_name(model_path.stem + ".stats.onnx")
    onnx.save(model, str(tmp))
    try:
        sums: dict[str, np.ndarray] = {}
        peaks: dict[str, np.ndarray] = {}
        count = 0
        for outs in analysis.run_model(tmp, batches):
            count += 1
            for t in tensors:
                x = np.asarray(outs[t], np.float64)
                axes = (0, *range(2, x.ndim))
                sums[t] = sums.get(t, 0) + x.mean(axis=axes)
                peaks[t] = np.maximum(peaks.get(t, 0), np.abs(x).max(axis=axes))
    finally:
        tmp.unlink(missing_ok=True)
    return {node: (sums[t] / max(count, 1), peaks[t]) for node, t in convs.items() if t in sums}


def conv_input_means(model_path: Path, batches: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Conv node name -> per-channel mean of its input over ``batches`` (bias correction's ``E[x]``)."""
    return {k: mean for k, (mean, _) in conv_input_stats(model_path, batches).items()}


def correct_bias(qdq_path: Path, float_path: Path, means: dict[str, np.ndarray]) -> int:
    """Subtract each quantized conv's weight-quantization mean shift ``(W_q - W) E[x]`` from its bias.

    Works on the QDQ model at ``qdq_path`` in place: int32 biases (behind a DequantizeLinear) are re-rounded,
    float biases edited directly. Convs left in float or without a bias are untouched. Returns convs corrected.
    """
    from onnx import numpy_helper

    from edgedeploy.precision import model_files

    model = model_files.load(qdq_path)
    graph = model.graph
    float_model = model_files.read_only(float_path)
    float_inits = {i.name: i for i in float_model.graph.initializer}
    float_w = {n.name: n.input[1] for n in float_model.graph.node if n.op_type == "Conv" and len(n.input) > 1}
    init_idx = {i.name: i for i in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}

    def arr(name: str) -> np.ndarray | None:
        return numpy_helper.to_array(init_idx[name]) if name in init_idx else None

    def dequant(dq: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
        q = arr(dq.input[0])
        scale = arr(dq.input[1])
        zp = arr(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else np.zeros_like(scale, dtype=np.int64)
        if q is None or scale is None or zp is None:
            return None
        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
        shape = [1] * q.ndim
        if scale.ndim and scale.size > 1:
            shape[axis] = -1
        deq = (q.astype(np.float64) - zp.reshape(shape)) * scale.astype(np.float64).reshape(shape)
        return deq, scale, zp, axis

    corrected = 0
    for node in graph.node:
        if node.op_type != "Conv" or len(node.input) < 3 or node.name not in means or node.name not in float_w:
            continue
        wdq = producers.get(node.input[1])
        if wdq is None or wdq.op_type != "DequantizeLinear" or float_w[node.name] not in float_inits:
            continue
        got = dequant(wdq)
        if got is None:
            continue
        w_q = got[0]
        w = numpy_helper.to_array(float_inits[float_w[node.name]]).astype(np.float64)
        if w.shape != w_q.shape:
            continue
        eps = w_q - w
        mu = means[node.name]
        groups = _group(node)
        out_ch, in_per_group = w.shape[0], w.shape[1]
        per_group_out = out_ch // groups
        idx = (np.arange(out_ch) // per_group_out)[:, None] * in_per_group + np.arange(in_per_group)[None, :]
        shift = (eps.sum(axis=tuple(range(2, eps.ndim))) * mu[idx]).sum(axis=1)  # (W_q - W) E[x] per output
        bias = node.input[2]
        bdq = producers.get(bias)
        if bdq is not None and bdq.op_type == "DequantizeLinear":
            got = dequant(bdq)
            if got is None:
                continue
            b, scale, zp, _ = got
            new = np.round((b - shift) / scale.astype(np.float64) + zp).astype(np.int64)
            info = np.iinfo(np.int32)
            init_idx[bdq.input[0]].CopyFrom(
                numpy_helper.from_array(np.clip(new, info.min, info.max).astype(np.int32), bdq.input[0])
            )
        elif bias in init_idx:
            b = numpy_helper.to_array(init_idx[bias]).astype(np.float64)
            init_idx[bias].CopyFrom(numpy_helper.from_array((b - shift).astype(np.float32), bias))
        else:
            continue
        corrected += 1
    if corrected:
        model_files.save(model, qdq_path)
    return corrected


def integer_clip_bounds(qdq_path: Path) -> int:
    """Run each rewritten ReLU6's per-channel ``Min`` on the quantized integers (onnxruntime QDQ models).

    ``Min`` is no QDQ op in onnxruntime, so the quantizer leaves ``DequantizeLinear -> Min -> QuantizeLinear``
    in float around it, which costs more than the INT8 convs save. With the Relu's range tied to the Min's
    (:func:`tie_clip_ranges`) both sides share scale and zero point, and ``min(q, round(b / s + zp))`` on the
    integers is exactly that chain. Returns the Min nodes rewritten (the model is saved only when any).
    """
    from onnx import helper, numpy_helper

    from edgedeploy.precision import model_files

    model = model_files.load(qdq_path)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[Any]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)

    def const(name: str) -> np.ndarray | None:
        return numpy_helper.to_array(inits[name]) if name in inits else None

    drop: set[str] = set()  # by first output: protobuf wrappers are no stable identities
    replace: dict[str, Any] = {}
    for node in graph.node:
        if node.op_type != "Min" or not node.name.endswith("__cle_min"):
            continue
        dq = producers.get(node.input[0])
        after = readers.get(node.output[0], [])
        if dq is None or dq.op_type != "DequantizeLinear" or len(after) != 1 or len(readers[dq.output[0]]) != 1:
            continue
        q = after[0]
        if q.op_type != "QuantizeLinear" or len(dq.input) < 3 or len(q.input) < 3:
            continue
        s_in, z_in, s_out, z_out = const(dq.input[1]), const(dq.input[2]), const(q.input[1]), const(q.input[2])
        bound = const(node.input[1])
        if s_in is None or z_in is None or s_out is None or z_out is None or bound is None:
            continue
        if any(v.size != 1 for v in (s_in, z_in, s_out, z_out)):  # per-tensor activations only
            continue
        if not (np.allclose(s_in, s_out, rtol=1e-6) and z_in == z_out):
            continue
        info = np.iinfo(z_in.dtype)
        qb = np.clip(np.round(bound / float(s_in) + int(z_in)), info.min, info.max).astype(z_in.dtype)
        name = f"{node.input[1]}__q"
        graph.initializer.append(numpy_helper.from_array(qb, name))
        replace[node.output[0]] = helper.make_node("Min", [dq.input[0], name], [q.output[0]], name=f"{node.name}__int")
        drop.update((dq.output[0], q.output[0]))
    if not replace:
        return 0
    nodes = [replace.get(n.output[0], n) for n in graph.node if n.output[0] not in drop]
    del graph.node[:]
    graph.node.extend(nodes)
    model_files.save(model, qdq_path)
    return len(replace)
