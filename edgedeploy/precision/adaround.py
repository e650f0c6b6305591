"""Learned weight rounding for INT8 CNNs (AdaRound: Nagel et al. 2020, "Up or Down? Adaptive Rounding for
Post-Training Quantization").

Rounding every weight to the nearest grid point minimizes each weight's own error, not the layer output's.
AdaRound learns, per weight, whether to round down or up (a rectified sigmoid ``h(V)`` relaxed to [0, 1],
pushed to 0 or 1 by an annealed regularizer) to minimize the layer's output error on calibration data:

    || W x  -  s (floor(W / s) + h(V)) x~ ||^2

where ``x`` is the layer's input in the float model and ``x~`` the input it reconstructs from: ``x`` itself
(the default, :func:`round_weights`), or its input in a quantized model (the asymmetric reconstruction of
the paper / QDrop / BRECQ, at once or sequentially, optionally half-way): measured on EfficientNet-Lite0
those fitted the calibration photos' activation error and lost on held-out photos (bench/README.md).
The loss is quadratic in the weights, so each layer needs only the second moments of its input patches
(``E[x~ x~^T]``, ``E[x x~^T]``, ``E[x x^T]``), accumulated once over the calibration batches; every
optimization step is one matrix product and the gradient is closed-form (no autograd).

The scales are ONNX Runtime's (per output channel or per tensor, symmetric: ``max|w| / 127``, or ``/ 64``
with 7-bit ``reduce_range``); :func:`apply_codes` writes the learned integer codes into a QDQ model the
quantizer wrote, behind the same DequantizeLinear scales (checked per channel), so ONNX Runtime and TensorRT
(which reads the Q/DQ scales) both run them. Grouped and depthwise convs are handled per group.

Domain layer: imports onnx, onnxruntime, numpy, torch and the precision package's plain helpers only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ZETA, GAMMA = 1.1, -0.1  # rectified sigmoid stretch (AdaRound paper)
WEIGHTED = ("Conv", "Gemm", "MatMul")


@dataclass
class Layer:
    """One weighted node the rounding is learned for.

    ``rows`` views the weight as (groups, rows per group, patch size): a Conv's output channels of each group,
    a Gemm/MatMul's output features (one group).
    """

    node: str
    op: str
    weight: str  # initializer name
    input: str  # activation input tensor (float model)
    shape: tuple[int, ...]  # the initializer's shape
    groups: int = 1
    transposed: bool = False  # Gemm transB = 0 / MatMul: initializer is (in, out)
    kernel: tuple[int, int] = (1, 1)
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilations: tuple[int, int] = (1, 1)

    def rows(self, w: np.ndarray) -> np.ndarray:
        """The initializer as (groups, out per group, patch): one row per output channel."""
        m = w.T if self.transposed else w
        out = m.shape[0]
        return m.reshape(self.groups, out // self.groups, -1)

    def unrows(self, r: np.ndarray) -> np.ndarray:
        if self.transposed:
            return r.reshape(self.shape[1], self.shape[0]).T
        return r.reshape(self.shape)


@dataclass
class Stats:
    """Second moments of one layer's input patches, summed over ``n`` positions: ``qq`` = sum x~ x~^T,
    ``xq`` = sum x x~^T, ``xx`` = sum x x^T (each (groups, patch, patch))."""

    qq: np.ndarray
    xq: np.ndarray
    xx: np.ndarray
    n: int = 0


@dataclass
class RoundingResult:
    """Learned integer codes per weight initializer, and each layer's output error (relative, on the
    calibration data) with nearest rounding vs the learned rounding."""

    codes: dict[str, np.ndarray] = field(default_factory=dict)  # weight initializer -> int8 codes (its shape)
    scales: dict[str, np.ndarray] = field(default_factory=dict)  # weight initializer -> per-channel scale
    axes: dict[str, int] = field(default_factory=dict)  # weight initializer -> its output-channel axis
    layers: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def weighted_layers(model: Any) -> list[Layer]:
    """Conv (2-D) / Gemm / MatMul nodes of an ONNX model whose weight is an initializer, in graph order."""
    from onnx import helper

    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    out: list[Layer] = []
    for n in model.graph.node:
        if n.op_type not in WEIGHTED or len(n.input) < 2 or not n.name or n.input[1] not in inits:
            continue
        if n.input[0] in inits:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        shape = inits[n.input[1]]
        if n.op_type == "Conv":
            if len(shape) != 4 or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
                continue
            pads = tuple(attrs.get("pads", (0, 0, 0, 0)))
            layer = Layer(
                n.name, "Conv", n.input[1], n.input[0], shape,
                groups=int(attrs.get("group", 1)),
                kernel=(int(shape[2]), int(shape[3])),
                strides=tuple(attrs.get("strides", (1, 1))),  # type: ignore[arg-type]
                pads=pads,  # type: ignore[arg-type]
                dilations=tuple(attrs.get("dilations", (1, 1))),  # type: ignore[arg-type]
            )  # fmt: skip
        elif n.op_type == "Gemm":
            if len(shape) != 2 or attrs.get("transA", 0):
                continue
            layer = Layer(n.name, "Gemm", n.input[1], n.input[0], shape, transposed=not attrs.get("transB", 0))
        else:
            if len(shape) != 2:
                continue
            layer = Layer(n.name, "MatMul", n.input[1], n.input[0], shape, transposed=True)
        out.append(layer)
    return out


def weight_scales(rows: np.ndarray, qmax: int = 127) -> np.ndarray:
    """ONNX Runtime's per-channel symmetric weight scale for each row: ``2 max|w| / (2 qmax)`` computed in
    float64 and stored as float32 (``compute_scale_zp``); 1.0 for an all-zero row."""
    absmax = np.abs(rows.astype(np.float32)).max(axis=-1).astype(np.float64)
    scale = (2 * absmax / (2 * qmax)).astype(np.float32)
    return np.where(scale < np.finfo(np.float32).tiny, np.float32(1.0), scale)


def _patches(layer: Layer, x: Any) -> Any:
    """torch tensor (groups, patch, positions) of the layer's input patches (im2col)."""
    import torch.nn.functional as F

    if layer.op == "Conv" and layer.kernel == (1, 1) and layer.strides == (1, 1) and not any(layer.pads):
        b, c, h, w = x.shape  # a pointwise conv's patches are its input pixels
        cols = x.reshape(b, layer.groups, c // layer.groups, h * w).permute(1, 2, 0, 3)
        return cols.reshape(layer.groups, c // layer.groups, b * h * w)
    if layer.op == "Conv":
        top, left, bottom, right = layer.pads
        if (top, left) != (bottom, right):
            x = F.pad(x, (left, right, top, bottom))
            padding: tuple[int, int] = (0, 0)
        else:
            padding = (top, left)
        cols = F.unfold(x, layer.kernel, dilation=layer.dilations, padding=padding, stride=layer.strides)
        b, d, positions = cols.shape
        cols = cols.reshape(b, layer.groups, d // layer.groups, positions).permute(1, 2, 0, 3)
        return cols.reshape(layer.groups, d // layer.groups, b * positions)
    flat = x.reshape(-1, x.shape[-1])
    return flat.T.unsqueeze(0)


def _with_outputs(model_path: Path, tensors: Sequence[str]) -> Any:
    import onnx

    model = onnx.load(str(model_path))
    have = {o.name for o in model.graph.output}
    for t in tensors:
        if t not in have:
            model.graph.output.append(onnx.ValueInfoProto(name=t))
            have.add(t)
    return model


def _session(model: Any) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def collect_stats(
    float_model: Path,
    layers: Sequence[Layer],
    batches: Sequence[dict[str, np.ndarray]],
    quantized_model: Path | None = None,
) -> dict[str, Stats]:
    """Layer node -> second moments of its input patches over ``batches`` (the calibration batches only).

    ``quantized_model``: a QDQ model of ``float_model`` (same node names); each layer's quantized input
    ``x~`` is the tensor its node reads there (a DequantizeLinear output). Without it ``x~ = x``.
    """
    import onnx

    float_inputs = [layer.input for layer in layers]
    fsess = _session(_with_outputs(float_model, float_inputs))
    qsess, q_inputs = None, {}
    if quantized_model is not None:
        qproto = onnx.load(str(quantized_model), load_external_data=False)
        by_name = {n.name: n for n in qproto.graph.node}
        q_inputs = {lay.node: by_name[lay.node].input[0] for lay in layers if lay.node in by_name}
        qsess = _session(_with_outputs(quantized_model, sorted(set(q_inputs.values()))))
    stats: dict[str, Stats] = {}
    for feeds in batches:
        fvals = dict(zip([o.name for o in fsess.get_outputs()], fsess.run(None, feeds)))
        qvals = dict(zip([o.name for o in qsess.get_outputs()], qsess.run(None, feeds))) if qsess else {}
        _accumulate(stats, layers, fvals, {n: qvals[t] for n, t in q_inputs.items()})
    return stats


def _accumulate(
    stats: dict[str, Stats], layers: Sequence[Layer], fvals: dict[str, np.ndarray], qvals: dict[str, np.ndarray]
) -> None:
    """Add one batch's patch moments: ``fvals`` float tensors by name, ``qvals`` quantized inputs by layer node."""
    import torch

    for layer in layers:
        x = _patches(layer, torch.from_numpy(np.ascontiguousarray(fvals[layer.input], np.float32)))
        xx = torch.bmm(x, x.transpose(1, 2)).double().numpy()
        s = stats.get(layer.node)
        if layer.node not in qvals:  # x~ = x: one moment, shared (output_error and learn_layer rely on it)
            if s is None:
                stats[layer.node] = s = Stats(xx.copy(), xx, xx, 0)
                s.xq = s.xx = s.qq
            else:
                s.qq += xx
            s.n += x.shape[-1]
            continue
        xq = _patches(layer, torch.from_numpy(np.ascontiguousarray(qvals[layer.node], np.float32)))
        qq = torch.bmm(xq, xq.transpose(1, 2)).double().numpy()
        xq_ = torch.bmm(x, xq.transpose(1, 2)).double().numpy()
        if s is None:
            stats[layer.node] = Stats(qq, xq_, xx, x.shape[-1])
        else:
            s.qq += qq
            s.xq += xq_
            s.xx += xx
            s.n += x.shape[-1]


def output_error(w: np.ndarray, w_hat: np.ndarray, s: Stats) -> float:
    """Relative output error ``E||W x - W^ x~||^2 / E||W x||^2`` from the second moments (rows layout).

    Written in the weight error ``D = W - W^`` and the input error ``e = x - x~`` (``W x - W^ x~ =
    D x + W^ e``), so nothing cancels: with ``x~ = x`` it is exactly ``D E[x x^T] D^T``."""
    d = w - w_hat
    ref = np.einsum("gmd,gde,gme->", w, s.xx, w)
    err = np.einsum("gmd,gde,gme->", d, s.xx, d)
    if s.qq is not s.xx:
        xe = s.xx - s.xq  # sum x e^T
        ee = xe - s.xq.transpose(0, 2, 1) + s.qq  # sum e e^T
        err += 2 * np.einsum("gmd,gde,gme->", d, xe, w_hat) + np.einsum("gmd,gde,gme->", w_hat, ee, w_hat)
    return float(max(err, 0.0) / max(ref, 1e-30))


def learn_layer(
    w: np.ndarray,
    scale: np.ndarray,
    s: Stats,
    *,
    qmax: int = 127,
    iters: int = 300,
    lam: float = 0.01,
    lr: float = 1e-2,
    warmup: float = 0.2,
    beta: tuple[float, float] = (20.0, 2.0),
) -> np.ndarray:
    """Integer codes (rows layout, like ``w``) minimizing the layer's output error (AdaRound).

    ``w``: (groups, rows, patch) float weights; ``scale``: (groups, rows) per-channel scales. The loss is
    ``mean over positions of sum over output channels of (W x - W^ x~)^2`` plus ``lam`` times the rounding
    regularizer ``sum 1 - |2h - 1|^beta`` (beta annealed from 20 to 2 after a warm-up without it).
    """
    import torch

    w_t = torch.from_numpy(w.astype(np.float32))
    sc = torch.from_numpy(scale.astype(np.float32)).unsqueeze(-1)
    n = max(s.n, 1)
    qq = torch.from_numpy((s.qq / n).astype(np.float32))
    # gradient 2 (W^ E[x~ x~^T] - W E[x x~^T]) = 2 ((W^ - W) E[x~ x~^T] + W (E[x~ x~^T] - E[x x~^T])):
    # the second term is constant (zero for float inputs) and the first has no cancellation
    same = s.qq is s.xx
    offset = torch.zeros_like(w_t) if same else torch.bmm(w_t, torch.from_numpy(((s.qq - s.xq) / n).astype(np.float32)))
    hessian = _low_rank(qq)  # (U sqrt(L)): W^ qq = (W^ U sqrt(L)) (U sqrt(L))^T, cheaper when rank << patch
    ratio = w_t / sc
    floor = torch.floor(ratio)
    rest = (ratio - floor).clamp(1e-4, 1 - 1e-4)
    v = -torch.log((ZETA - GAMMA) / (rest - GAMMA) - 1)  # h(v) == rest at the start
    m = torch.zeros_like(v)
    u = torch.zeros_like(v)
    b1, b2, eps = 0.9, 0.999, 1e-8
    start = int(warmup * iters)
    for t in range(1, iters + 1):
        sig = torch.sigmoid(v)
        raw = sig * (ZETA - GAMMA) + GAMMA
        h = raw.clamp(0, 1)
        codes = (floor + h).clamp(-qmax, qmax)
        w_hat = sc * codes
        d = w_hat - w_t
        grad_w = 2 * ((torch.bmm(d, qq) if hessian is None else (d @ hessian) @ hessian.T) + offset)
        grad_h = grad_w * sc
        if t > start:
            b = beta[1] + (beta[0] - beta[1]) * max(0.0, 1 - (t - start) / max(iters - start, 1))
            c = 2 * h - 1
            grad_h = grad_h - lam * b * c.abs().pow(b - 1) * torch.sign(c) * 2
        grad_v = grad_h * ((raw > 0) & (raw < 1)) * (ZETA - GAMMA) * sig * (1 - sig)
        m.mul_(b1).add_(grad_v, alpha=1 - b1)
        u.mul_(b2).addcmul_(grad_v, grad_v, value=1 - b2)
        v -= lr * (m / (1 - b1**t)) / ((u / (1 - b2**t)).sqrt() + eps)
    h = (torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA).clamp(0, 1)
    return (floor + (h >= 0.5).float()).clamp(-qmax, qmax).numpy().astype(np.int8)


def _low_rank(qq: Any) -> Any:
    """A factor ``F`` (patch, rank) with ``F F^T == qq`` for one group whose rank is under half its size
    (few calibration positions: a classifier's Gemm sees one per sample), else None."""
    import torch

    if qq.shape[0] != 1 or qq.shape[1] < 256:
        return None
    vals, vecs = torch.linalg.eigh(qq[0].double())
    keep = vals > vals.max() * 1e-7
    if int(keep.sum()) * 2 > qq.shape[1]:
        return None
    return (vecs[:, keep] * vals[keep].sqrt()).float()


def learn_rounding(
    float_model: Path,
    batches: Sequence[dict[str, np.ndarray]],
    *,
    quantized_model: Path | None = None,
    sequential: int = 0,
    mix: float = 1.0,
    per_channel: bool = True,
    nodes: Sequence[str] | None = None,
    qmax: int = 127,
    iters: int = 300,
    log: Callable[[str], None] | None = None,
) -> RoundingResult:
    """Learn the rounding of every Conv/Gemm/MatMul weight of ``float_model`` on ``batches``.

    ``batches`` must be calibration (training) batches only: the held-out data that judges the INT8 model is
    never passed here. ``quantized_model``: the QDQ model whose layer inputs are the ``x~`` to reconstruct
    from (see :func:`collect_stats`); ``sequential`` > 0 (with ``quantized_model``): layers are learned in
    graph order, ``sequential`` at a time, each group's ``x~`` taken from the QDQ model with the groups before
    it already rounded (the learned codes fed in place of its weight codes). ``mix`` < 1: reconstruct from
    ``mix x~ + (1 - mix) x`` instead (halfway to the float input: less fitted to the calibration data's
    activation error). ``per_channel``: ORT's per-channel weight scales, else one per tensor.
    ``nodes``: only these layers.
    A layer whose learned codes reconstruct worse than nearest rounding on the calibration data keeps nearest
    rounding.
    """
    import time

    import onnx
    import torch
    from onnx import numpy_helper

    t0 = time.perf_counter()
    proto = onnx.load(str(float_model))
    inits = {i.name: i for i in proto.graph.initializer}
    layers = [layer for layer in weighted_layers(proto) if nodes is None or layer.node in set(nodes)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    result = RoundingResult()

    def learn(layer: Layer, stats: Stats) -> np.ndarray:
        if mix < 1.0:
            a = mix
            stats = Stats(
                a * a * stats.qq + a * (1 - a) * (stats.xq + stats.xq.transpose(0, 2, 1)) + (1 - a) ** 2 * stats.xx,
                a * stats.xq + (1 - a) * stats.xx,
                stats.xx,
                stats.n,
            )
        w = layer.rows(numpy_helper.to_array(inits[layer.weight]).astype(np.float32))
        g, rows, _ = w.shape
        if per_channel:
            scale = weight_scales(w.reshape(g * rows, -1), qmax).reshape(g, rows)
        else:  # one scale for the whole tensor, as ORT's per-tensor weights
            scale = np.broadcast_to(weight_scales(w.reshape(1, -1), qmax), (g, rows)).copy()
        nearest = np.clip(np.round(w / scale[..., None]), -qmax, qmax)
        learned = learn_layer(w, scale, stats, qmax=qmax, iters=iters).astype(np.float64)
        w64 = w.astype(np.float64)
        e_near = output_error(w64, nearest * scale[..., None], stats)
        e_learn = output_error(w64, learned * scale[..., None], stats)
        kept = e_learn <= e_near
        codes = layer.unrows(learned if kept else nearest).astype(np.int8)
        result.codes[layer.weight] = codes
        result.scales[layer.weight] = scale.reshape(-1)
        result.axes[layer.weight] = 1 if layer.transposed else 0
        flipped = float((learned != nearest).mean())
        result.layers.append(
            {"node": layer.node, "error_nearest": round(e_near, 6), "error_learned": round(e_learn, 6),
             "flipped": round(flipped, 4), "learned": bool(kept)}
        )  # fmt: skip
        if log:
            log(f"adaround {layer.node}: output error {e_near:.4g} -> {e_learn:.4g} ({flipped:.1%} flipped)")
        return codes

    try:
        with torch.no_grad():
            if quantized_model is None or sequential <= 0:
                stats = collect_stats(float_model, layers, batches, quantized_model)
                for layer in layers:
                    learn(layer, stats.pop(layer.node))
            else:
                _sequential(float_model, quantized_model, layers, batches, sequential, learn, result)
    finally:
        torch.set_num_threads(threads)
    result.seconds = time.perf_counter() - t0
    return result


def _sequential(
    float_model: Path,
    quantized_model: Path,
    layers: Sequence[Layer],
    batches: Sequence[dict[str, np.ndarray]],
    group: int,
    learn: Callable[[Layer, Stats], np.ndarray],
    result: RoundingResult,
) -> None:
    """Learn ``layers`` ``group`` at a time; each group's quantized inputs come from ``quantized_model`` with
    the weight codes of the groups before it replaced by the learned ones (fed as graph inputs)."""
    import onnx
    from onnx import numpy_helper

    qproto = onnx.load(str(quantized_model))
    qinits = {i.name: i for i in qproto.graph.initializer}
    producers = {o: n for n in qproto.graph.node for o in n.output}
    by_name = {n.name: n for n in qproto.graph.node}
    q_inputs: dict[str, str] = {}
    fed: dict[str, tuple[Layer, np.ndarray, np.ndarray]] = {}  # int8 initializer -> (layer, codes, its scale)
    for layer in layers:
        node = by_name.get(layer.node)
        if node is None:
            continue
        q_inputs[layer.node] = node.input[0]
        dq = producers.get(node.input[1])
        if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in qinits:
            codes = numpy_helper.to_array(qinits[dq.input[0]])
            scale = numpy_helper.to_array(qinits[dq.input[1]]).astype(np.float32).reshape(-1)
            fed[dq.input[0]] = (layer, codes, scale)
    keep = [i for i in qproto.graph.initializer if i.name not in fed]
    del qproto.graph.initializer[:]
    qproto.graph.initializer.extend(keep)
    for name, (_, codes, _) in fed.items():
        qproto.graph.input.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT8, codes.shape))
    have = {o.name for o in qproto.graph.output}
    for t in sorted(set(q_inputs.values()) - have):
        qproto.graph.output.append(onnx.ValueInfoProto(name=t))
    qsess = _session(qproto)
    fsess = _session(_with_outputs(float_model, [layer.input for layer in layers]))
    codes_now = {name: codes for name, (_, codes, _) in fed.items()}
    by_weight = {lay.weight: name for name, (lay, _, _) in fed.items()}
    for start in range(0, len(layers), group):
        chunk = layers[start : start + group]
        stats: dict[str, Stats] = {}
        ftensors = sorted({lay.input for lay in chunk})
        qtensors = sorted({q_inputs[lay.node] for lay in chunk if lay.node in q_inputs})
        for feeds in batches:
            fvals = dict(zip(ftensors, fsess.run(ftensors, feeds)))
            qvals = dict(zip(qtensors, qsess.run(qtensors, {**feeds, **codes_now}))) if qtensors else {}
            _accumulate(stats, chunk, fvals, {n: qvals[t] for n, t in q_inputs.items() if t in qvals})
        for layer in chunk:
            learned = learn(layer, stats.pop(layer.node))
            q_name = by_weight.get(layer.weight)
            if q_name is not None:
                _, old, scale = fed[q_name]
                same = np.isclose(scale, result.scales[layer.weight], rtol=1e-6, atol=0)
                shape = [1] * old.ndim
                shape[result.axes[layer.weight]] = -1
                if old.shape == learned.shape and same.shape[0] == old.shape[result.axes[layer.weight]]:
                    codes_now[q_name] = np.where(same.reshape(shape), learned, old).astype(np.int8)


def apply_codes(qdq_path: Path, result: RoundingResult) -> int:
    """Write the learned codes into the QDQ model at ``qdq_path``: every weight DequantizeLinear whose int8
    initializer was quantized from a weight in ``result`` gets the learned codes in each output channel whose
    scale is the one they were learned for. ONNX Runtime raises the weight scale of a channel whose int32 bias
    would overflow (a dead channel: near-zero weights, a bias); such channels keep ORT's codes.
    Returns the weights rewritten (the file is rewritten only when there are any)."""
    from onnx import numpy_helper

    if not result.codes:
        return 0
    from edgedeploy.precision import model_files

    model = model_files.load(qdq_path)
    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    changed = 0
    done: set[str] = set()
    for node in model.graph.node:
        if node.op_type not in WEIGHTED or len(node.input) < 2:
            continue
        dq = producers.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits or dq.input[0] in done:
            continue
        q_name = dq.input[0]
        source = _source_weight(q_name, result.codes)
        if source is None:
            continue
        old = numpy_helper.to_array(inits[q_name])
        new = result.codes[source]
        scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32).reshape(-1)
        ours = result.scales[source]
        if scale.size == 1:  # per-tensor weights
            scale = np.broadcast_to(scale, ours.shape)
        if old.dtype != np.int8 or old.shape != new.shape or scale.shape != ours.shape:
            continue
        same = np.isclose(scale, ours, rtol=1e-6, atol=0)
        if not same.any():
            continue
        axis = result.axes.get(source, 0)
        shape = [1] * old.ndim
        shape[axis] = -1
        codes = np.where(same.reshape(shape), new, old).astype(np.int8)
        inits[q_name].CopyFrom(numpy_helper.from_array(codes, q_name))
        done.add(q_name)
        changed += 1
    if changed:
        model_files.save(model, qdq_path)
    return changed


def _source_weight(quantized_name: str, codes: dict[str, np.ndarray]) -> str | None:
    """The float weight an ORT-quantized initializer came from (ORT names it ``<weight>_quantized``)."""
    for suffix in ("_quantized",):
        if quantized_name.endswith(suffix) and quantized_name[: -len(suffix)] in codes:
            return quantized_name[: -len(suffix)]
    return quantized_name if quantized_name in codes else None


def round_weights(
    q: Any,
    batches: Sequence[dict[str, np.ndarray]],
    *,
    iters: int = 300,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Learn the weight rounding for the :class:`~edgedeploy.precision.quantize.Quantizer` ``q`` and set it
    (``q.weight_codes``); its later :meth:`quantize` calls write the learned codes, before bias correction
    (which then measures the rounded model).

    Each layer's float output is reconstructed from its float input (the weights-only objective): on
    EfficientNet-Lite0 reconstructing from the nearest-rounded INT8 model's inputs instead scored worse on
    held-out photos (every layer then compensates the upstream error the upstream layers fix too; see
    bench/README.md). ``batches``: the calibration batches only, never the held-out ones.
    Returns the note for precision.json.
    """
    reduce_range = q.flavour.reduce_range if q.reduce_range is None else q.reduce_range
    result = learn_rounding(
        q.float_model, batches, qmax=64 if reduce_range else 127, per_channel=q.per_channel, iters=iters, log=log
    )
    q.weight_codes = result
    q.output_shifts = q.output_shifts_for = None  # the rounded model's mean shifts differ: measured again
    errors = {
        "nearest": [r["error_nearest"] for r in result.layers],
        "learned": [min(r["error_learned"], r["error_nearest"]) for r in result.layers],
    }
    return {
        "method": "adaround",
        "reconstructs": "each layer's float output from its float input, on the calibration batches",
        "layers": len(result.layers),
        "layers_learned": sum(bool(r["learned"]) for r in result.layers),
        "calibration_batches": len(batches),
        "iterations": iters,
        "mean_output_error": {k: round(float(np.mean(v or [0.0])), 6) for k, v in errors.items()},
    }
