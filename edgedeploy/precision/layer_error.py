"""INT8 sensitivity in one pass: each quantized node's own output error on the calibration batches.

The float-fallback search needs the nodes ranked by how much their quantization hurts. Quantizing one node at
a time and scoring the whole model (:func:`edgedeploy.precision.fallback.layer_sensitivity`) costs one
quantization and one model run per node: on a 60-layer CNN most of a build. Here the all-INT8 model is taken
apart instead: for every quantized node a copy of it, with its own Q/DQ on the inputs and its quantized
weights and bias, reads the *float* model's input tensors, and its output is compared with the float node's
output. All the copies sit in one probe model, so the ranking costs one float run (intermediates exposed)
and one probe run over a few calibration batches, whatever the node count.

The error is relative (mean squared error over the float output's mean square; SQNR in dB is its
``-10 log10``): what that node's input rounding, weight rounding and bias correction alone cost, with the
upstream layers exact. It does not see how the error grows downstream; the search judges each float set on
the held-out data, so the ranking only orders the tries.

Domain layer: onnx, onnxruntime and numpy; imports nothing above the precision package.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.precision.bias_correction import session_from_proto

# calibration batches the ranking measures on (each one's intermediates are held while the probe runs)
SAMPLES = 8
_PROBE = "layer_error/"  # prefix of every tensor and node the probe model adds


def layer_errors(
    qdq_model: Path,
    float_model: Path,
    batches: Sequence[dict[str, np.ndarray]],
    workdir: Path,
    candidates: Sequence[str],
    *,
    qdq_as_written: bool = False,
) -> list[dict[str, Any]]:
    """Rows ``{"node", "op", "output_error", "sqnr_db"}`` for the ``candidates`` (nodes the QDQ model
    quantized), largest error first; nodes that cannot be probed (an output the float model lacks) come last
    with ``output_error`` None, in their given order. ``qdq_as_written``: the probe runs as the judge runs the
    model (:func:`edgedeploy.onnxtools.ort.ort_session`).

    Raises:
        StageError: onnxruntime cannot load or run the float model or the probe model.
    """
    import onnx

    qdq = onnx.load(str(qdq_model))
    flt = onnx.load(str(float_model))
    graph_inputs = {i.name for i in flt.graph.input}
    float_tensors = {o for n in flt.graph.node for o in n.output} | graph_inputs
    probe, sources, outputs, ops = _probe_model(qdq, flt, candidates, float_tensors)
    batches = list(batches)[:SAMPLES]
    rows: list[dict[str, Any]] = []
    errors: dict[str, float] = {}
    if outputs and batches:
        wanted = sorted({*sources.values(), *(t for _, t in outputs.values())} - graph_inputs)
        exposed = onnx.load(str(float_model))
        have = {o.name for o in exposed.graph.output}
        for name in wanted:
            if name not in have:
                exposed.graph.output.append(onnx.ValueInfoProto(name=name))
        float_sess = session_from_proto(exposed, workdir / "layer_error.float.onnx")
        probe_sess = session_from_proto(probe, workdir / "layer_error.probe.onnx", qdq_as_written)
        fetch = list(outputs)
        noise = dict.fromkeys(fetch, 0.0)
        power = dict.fromkeys(fetch, 0.0)
        for feeds in batches:
            values = dict(zip(wanted, float_sess.run(wanted, feeds)))
            values.update({k: v for k, v in feeds.items() if k in graph_inputs})
            got = probe_sess.run(fetch, {p: values[src] for p, src in sources.items()})
            for probe_out, approx in zip(fetch, got):
                exact = values[outputs[probe_out][1]].astype(np.float64)
                noise[probe_out] += float(np.sum((approx.astype(np.float64) - exact) ** 2))
                power[probe_out] += float(np.sum(exact**2))
        errors = {outputs[p][0]: noise[p] / max(power[p], 1e-30) for p in fetch}
    for node in candidates:
        err = errors.get(node)
        sqnr = None if err is None else (math.inf if err == 0 else round(-10 * math.log10(err), 2))
        rows.append({"node": node, "op": ops.get(node, ""), "output_error": err, "sqnr_db": sqnr})
    rows.sort(key=lambda r: -1.0 if r["output_error"] is None else r["output_error"], reverse=True)
    return rows


def _probe_model(qdq: Any, flt: Any, candidates: Sequence[str], float_tensors: set[str]):
    """(probe model, probe input -> float tensor it reads, probe output -> (candidate, float tensor it is
    compared with), node -> op).

    Each candidate's copy keeps the QDQ model's own nodes between its activations and itself (their
    QuantizeLinear / DequantizeLinear, the weights' DequantizeLinear); an activation input is read from the
    float model at the tensor the QuantizeLinear quantizes (or, unquantized, at that tensor itself). Where
    the quantizer folded an activation into the node (a Conv writing the Relu's / Clip's output tensor), the
    float model's activation node is copied after it, so both sides compare the same tensor.
    """
    import onnx
    from onnx import helper

    graph = qdq.graph
    inits = {i.name for i in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    by_name = {n.name: n for n in graph.node}
    float_by_name = {n.name: n for n in flt.graph.node}
    float_producers = {o: n for n in flt.graph.node for o in n.output}
    float_inits = {i.name: i for i in flt.graph.initializer}
    extra_inits: dict[str, Any] = {}
    nodes: list[Any] = []
    used_inits: set[str] = set()
    sources: dict[str, str] = {}
    outputs: dict[str, tuple[str, str]] = {}
    ops: dict[str, str] = {}
    for i, name in enumerate(candidates):
        node = by_name.get(name)
        if node is None:
            continue
        ops[name] = node.op_type
        if not node.output or node.output[0] not in float_tensors:
            continue
        prefix = f"{_PROBE}{i}/"
        copied: list[Any] = []
        renamed: dict[str, str] = {}

        def feed(tensor: str, prefix: str = prefix) -> str | None:
            if tensor not in float_tensors:
                return None
            sources[prefix + tensor] = tensor
            return prefix + tensor

        def visit(tensor: str, prefix: str = prefix, copied: list[Any] = copied, renamed: dict[str, str] = renamed):
            """The probe's name for ``tensor``: an initializer as it is, a constant or Q/DQ path copied, an
            activation read from the float model (None: not there)."""
            if not tensor or tensor in inits:
                if tensor:
                    used_inits.add(tensor)
                return tensor
            if tensor in renamed:
                return renamed[tensor]
            prod = producers.get(tensor)
            if prod is None:
                return feed(tensor)
            if prod.op_type == "QuantizeLinear" and prod.input[0] not in inits:
                first = feed(prod.input[0])  # the activation this Q quantizes, exact from the float model
                rest = [visit(t) for t in prod.input[1:]]
                new_inputs = [first, *rest]
            elif prod.op_type in ("QuantizeLinear", "DequantizeLinear") or not prod.input:
                new_inputs = [visit(t) for t in prod.input]
            else:
                return feed(tensor)  # an unquantized activation: exact from the float model
            if any(t is None for t in new_inputs):
                return None
            copy = onnx.NodeProto()
            copy.CopyFrom(prod)
            copy.name = prefix + (prod.name or prod.output[0])
            del copy.input[:]
            copy.input.extend(new_inputs)
            del copy.output[:]
            copy.output.extend(prefix + o for o in prod.output)
            for o in prod.output:
                renamed[o] = prefix + o
            copied.append(copy)
            return renamed[tensor]

        new_inputs = [visit(t) for t in node.input]
        if any(t is None for t in new_inputs):
            for key in [k for k in sources if k.startswith(prefix)]:
                del sources[key]
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = prefix + node.name
        del copy.input[:]
        copy.input.extend(new_inputs)
        del copy.output[:]
        copy.output.extend(prefix + o for o in node.output)
        tail = _folded_activation(node, float_by_name, float_producers)
        if tail is not None:  # the quantizer folded this activation into the node: apply it in the probe too
            if any(t and t != tail.input[0] and t not in float_inits for t in tail.input):
                continue
            act = onnx.NodeProto()
            act.CopyFrom(tail)
            act.name = prefix + tail.name
            act.input[0] = prefix + node.output[0]
            act.output[0] = prefix + node.output[0] + "/activation"
            extra_inits.update({t: float_inits[t] for t in tail.input[1:] if t in float_inits})
            copied.extend([copy, act])
            last = act.output[0]
        else:
            copied.append(copy)
            last = prefix + node.output[0]
        nodes.extend(copied)
        outputs[last] = (name, node.output[0])
    probe_graph = helper.make_graph(
        nodes,
        "layer_error_probe",
        [helper.make_tensor_value_info(p, onnx.TensorProto.FLOAT, None) for p in sources],
        [helper.make_tensor_value_info(p, onnx.TensorProto.FLOAT, None) for p in outputs],
        [i for i in graph.initializer if i.name in used_inits]
        + [i for n, i in extra_inits.items() if n not in used_inits],
    )
    probe = helper.make_model(probe_graph, opset_imports=list(qdq.opset_import))
    probe.ir_version = qdq.ir_version
    return probe, sources, outputs, ops


def _folded_activation(node: Any, float_by_name: dict[str, Any], float_producers: dict[str, Any]) -> Any:
    """The float model's single-input activation (Relu, Clip, ...) whose output tensor the quantized ``node``
    writes directly (the quantizer folded it in), else None."""
    producer = float_producers.get(node.output[0])
    own = float_by_name.get(node.name)
    if producer is None or own is None or producer.name == node.name:
        return None
    return producer if producer.input and producer.input[0] == own.output[0] else None
