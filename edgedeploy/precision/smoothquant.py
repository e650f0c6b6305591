"""SmoothQuant-style smoothing of weight MatMuls (Xiao et al. 2023, "SmoothQuant: Accurate and Efficient
Post-Training Quantization for Large Language Models").

A few activation channels of a transformer carry values 10-100x the rest; one INT8 scale per tensor then
spends its range on them and the other channels lose their precision. Smoothing moves that difficulty into
the weights, which quantize per channel: for a MatMul ``Y = X W`` with ``X`` of K channels, divide ``X``'s
channel j by ``s_j = max|X_j|^alpha / max|W_j,:|^(1-alpha)`` and multiply ``W``'s row j by it. ``Y`` is
mathematically unchanged, so a smoothed MatMul left in float costs nothing in accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgedeploy.precision.ranges import RangeStats

if TYPE_CHECKING:
    from onnx import ModelProto


def smooth(model: ModelProto, stats: dict[str, RangeStats], nodes: Sequence[str], alpha: float) -> list[dict[str, Any]]:
    """Smooth the weight MatMuls ``nodes`` of ``model`` in place; returns one row per smoothed activation.

    MatMuls reading the same activation share one factor ``s`` (weights' max over all of them). The weights'
    rows are multiplied by ``s``; the activation is divided by ``s``: folded into the LayerNorm that makes it
    when the smoothed MatMuls are its only readers (and its scale / bias are its own), else by one ``Mul``
    inserted in front of those MatMuls. Activations without per-channel statistics in ``stats``
    (:func:`edgedeploy.precision.ranges.collect_ranges` ``channel_tensors``), or whose weights are shared
    with other nodes, are left alone.
    """
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    by_name = {n.name: n for n in model.graph.node}
    readers: dict[str, list[Any]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    producer = {o: n for n in model.graph.node for o in n.output}
    outputs = {o.name for o in model.graph.output}
    groups: dict[str, list[Any]] = {}
    k_axis: dict[str, int] = {}  # weight axis that runs along the activation's channels
    for name in nodes:
        n = by_name[name]
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "Gemm" and attrs.get("transA", 0):
            continue
        k_axis[n.name] = 1 if n.op_type == "Gemm" and attrs.get("transB", 0) else 0
        groups.setdefault(n.input[0], []).append(n)
    rows = []
    for act, group in groups.items():
        st = stats.get(act)
        if st is None or st.channel_absmax is None:
            continue
        if any(len(readers[n.input[1]]) != sum(m.input[1] == n.input[1] for m in group) for n in group):
            continue  # a weight also read outside the group would change those readers too
        weights = {n.input[1]: numpy_helper.to_array(inits[n.input[1]]).astype(np.float32) for n in group}
        axis = {n.input[1]: k_axis[n.name] for n in group}
        x_max = st.channel_absmax.astype(np.float64)
        w_max = np.max([np.abs(w).max(axis=1 - axis[k]) for k, w in weights.items()], axis=0).astype(np.float64)
        if x_max.shape != w_max.shape:
            continue
        ok = (x_max > 0) & (w_max > 0)
        s = np.ones_like(x_max)
        s[ok] = np.clip(x_max[ok] ** alpha / w_max[ok] ** (1.0 - alpha), 1e-5, 1e5)
        s32 = s.astype(np.float32)
        for wname, w in weights.items():
            scaled = w * (s32[:, None] if axis[wname] == 0 else s32[None, :])
            inits[wname].CopyFrom(numpy_helper.from_array(scaled, wname))
        prod = producer.get(act)
        affine = [i for i in (prod.input[1:3] if prod is not None else []) if i]
        foldable = (
            prod is not None
            and prod.op_type == "LayerNormalization"
            and len(readers.get(act, [])) == len(group)
            and act not in outputs
            and all(i in inits and len(readers[i]) == 1 for i in affine)
        )
        if foldable and prod is not None:
            for name in affine:
                t = inits[name]
                t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) / s32, name))
            how = f"folded into {prod.name}"
        else:
            inv = f"{act}_smooth_inv"
            model.graph.initializer.append(numpy_helper.from_array(1.0 / s32, inv))
            smoothed = f"{act}_smoothed"
            first = min(list(model.graph.node).index(n) for n in group)
            model.graph.node.insert(first, helper.make_node("Mul", [act, inv], [smoothed], name=f"{act}_smooth"))
            for n in group:
                n.input[0] = smoothed
            how = "Mul inserted"
        after = x_max / s
        rows.append(
            {
                "tensor": act,
                "matmuls": [n.name for n in group],
                "how": how,
                "channel_outlier_ratio_before": float(x_max.max() / max(float(np.median(x_max)), 1e-12)),
                "channel_outlier_ratio_after": float(after.max() / max(float(np.median(after)), 1e-12)),
            }
        )
    return rows
