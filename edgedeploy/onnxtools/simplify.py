"""onnxslim simplification (constant folding, shape inference, fusions) kept only when it provably changes nothing.

The simplified model is run next to the unsimplified one in ONNX Runtime on the same
inputs; any output that differs beyond ``atol`` (or a run that fails) discards it.

Shapes are inferred once, before onnxslim runs, by ONNX Runtime's symbolic shape inference (onnx's own
where that fails), and onnxslim is told not to infer them again: its own symbolic pass runs after each of
its optimisation rounds and hands the whole model, weights included, to onnx's inference each time. On
all-MiniLM-L6-v2 that made the simplification 3.3 s against 0.9 s this way, for the same graph
(bench/simplify_cost.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from onnx import ModelProto


SIMPLIFY_ATOL = 1e-5


def run_proto(proto: ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Outputs of an in-memory ONNX model in ONNX Runtime (CPU) for each feed dict."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(proto.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(names, feed))) for feed in feeds]


def simplify_checked(
    proto: ModelProto, feeds: list[dict[str, np.ndarray]], *, atol: float = SIMPLIFY_ATOL
) -> tuple[Any, dict[str, Any]]:
    """Simplify ``proto`` with onnxslim; return (model to keep, figures).

    Node metadata (the exporters' source locations) is carried over by node name, since
    onnxslim does not keep it. ``figures["status"]`` is ``kept`` or ``discarded`` (with ``reason``).
    """
    import onnxslim

    before = len(proto.graph.node)
    try:
        slim = onnxslim.slim(with_inferred_shapes(_copy(proto)), no_shape_infer=True)
    except Exception as exc:  # onnxslim raises whatever its passes raise
        return proto, {"status": "discarded", "reason": f"onnxslim failed: {_short(exc)}", "nodes_before": before}
    if slim is None:
        return proto, {"status": "discarded", "reason": "onnxslim returned no model", "nodes_before": before}
    try:
        ref = run_proto(proto, feeds)
        got = run_proto(slim, feeds)
    except Exception as exc:  # the simplified model not loading or running is a reason to discard it
        return proto, {"status": "discarded", "reason": f"simplified model does not run: {_short(exc)}"}
    worst = 0.0
    for r, g in zip(ref, got):
        for name, a in r.items():
            b = g.get(name)
            if b is None or b.shape != a.shape:
                return proto, {"status": "discarded", "reason": f"output {name!r} changed shape or vanished"}
            if a.size:
                worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
    if not worst <= atol:
        return proto, {"status": "discarded", "reason": f"outputs differ by {worst:.3g} (> {atol:g})"}
    _keep_declared_outputs(proto, slim)
    _carry_node_metadata(proto, slim)
    del slim.metadata_props[:]
    slim.metadata_props.extend(proto.metadata_props)
    return slim, {
        "status": "kept",
        "nodes_before": before,
        "nodes_after": len(slim.graph.node),
        "max_abs_vs_unsimplified": worst,
        "inputs_checked": len(feeds),
    }


def with_inferred_shapes(model: ModelProto) -> ModelProto:
    """``model`` with value_info for what shape inference can tell: ONNX Runtime's symbolic inference (named
    dims carried through Reshape / MatMul), else onnx's own, else ``model`` unchanged (onnxslim then folds
    less, and the result is still checked by running it)."""
    import onnx

    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
        if inferred is not None:
            return inferred
    except Exception:  # an op it has no rule for, a merge it refuses: onnx's inference is the fallback
        pass
    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception:  # onnx raises its own errors and RuntimeError alike
        return model


def _keep_declared_outputs(src: Any, dst: Any) -> None:
    """The graph outputs' declared types as the exporter wrote them (inference may rename their dims)."""
    declared = {o.name: o.type for o in src.graph.output}
    for out in dst.graph.output:
        if out.name in declared:
            out.type.CopyFrom(declared[out.name])


def _carry_node_metadata(src: Any, dst: Any) -> None:
    by_name = {n.name: n for n in src.graph.node if n.name}
    for node in dst.graph.node:
        old = by_name.get(node.name)
        if old is not None and not node.metadata_props and old.metadata_props:
            node.metadata_props.extend(old.metadata_props)
        if old is not None and not node.doc_string and old.doc_string:
            node.doc_string = old.doc_string


def _copy(proto: ModelProto) -> Any:
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    return out


def _short(exc: BaseException, n: int = 200) -> str:
    text = " ".join(str(exc).split())
    return text[:n] + ("..." if len(text) > n else "")
