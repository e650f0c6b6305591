"""FP16 that keeps accuracy: find the layers whose activations leave FP16's range and keep them FP32.

How the pins reach the engine follows the target (``TargetProfile.strongly_typed_only``):
TensorRT <= 10 gets the FP32 graph plus the builder's FP16 flag and per-layer FP32 pins (``precision.json``,
no FP16 ONNX file at all); TensorRT 11 (strongly typed networks, no precision flags) gets an FP16 ONNX model
whose pinned nodes, inputs and outputs stay FP32, with a Cast on every edge where the type changes.

:func:`mixed_fp16` writes that model. It is our own pass rather than onnxconverter-common's
``convert_float_to_float16`` because that converter, given a node block list, writes models ONNX Runtime
refuses ("Type (tensor(float)) of output arg ... does not match expected type (tensor(float16))") and prints
dozens of UserWarnings. Here every tensor's type in the new graph is tracked while the nodes are walked in
order, so each edge gets exactly the Cast it needs, and the result is checked with onnx.checker and shape
inference before it is written. The same model, written to a temporary folder, is the host check for
TensorRT <= 10 (the pinned layers in FP32, the rest in FP16, as the builder will run them).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgedeploy.errors import StageError

if TYPE_CHECKING:
    from onnx import ModelProto

FP16_MAX = 65504.0
# Ops kept in FP32 whatever the pins say: their float inputs or outputs are fixed to float32 by the ONNX
# spec (NonMaxSuppression boxes, Q/DQ scales), their output type comes from an attribute we do not rewrite
# (random ops, EyeLike), or they carry subgraphs whose outer-scope reads we cannot retype.
FP32_OPS = frozenset(
    {
        "NonMaxSuppression",
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "EyeLike",
        "If",
        "Loop",
        "Scan",
        "SequenceMap",
        "STFT",
        "MelWeightMatrix",
        "Window",
        "HannWindow",
        "HammingWindow",
        "BlackmanWindow",
    }
)
# Float inputs that the ONNX spec fixes to float32 even when the op computes in float16.
FLOAT32_INPUTS = {"Resize": frozenset({1, 2}), "Upsample": frozenset({1}), "Dropout": frozenset({1})}


def fp16_strategy(strongly_typed_only: bool) -> str:
    """``typed-onnx`` (FP16 ONNX model) for strongly typed TensorRT, else ``builder-flag`` (FP16 flag + pins)."""
    return "typed-onnx" if strongly_typed_only else "builder-flag"


@contextlib.contextmanager
def captured_warnings() -> Iterator[list[str]]:
    """Collect Python warnings raised inside the block (deduplicated text) instead of printing them.

    The caller decides what reaches the user (one summary line, the full list in precision.json).
    """
    seen: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield seen
    for w in caught:
        text = f"{w.category.__name__}: {' '.join(str(w.message).split())[:200]}"
        if text not in seen:
            seen.append(text)


def _subgraph_outer_reads(model: ModelProto) -> set[str]:
    """Names that subgraphs (If/Loop/Scan bodies) read from the enclosing graph."""
    from onnx import AttributeProto

    reads: set[str] = set()

    def walk(graph: Any, defined: set[str]) -> None:
        local = set(defined) | {i.name for i in graph.input} | {i.name for i in graph.initializer}
        for node in graph.node:
            for name in node.input:
                if name and name not in local:
                    reads.add(name)
            for attr in node.attribute:
                subs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
                for sub in subs:
                    walk(sub, local)
            local.update(node.output)

    for node in model.graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                walk(sub, set())
    return reads


def _elem_types(model: ModelProto) -> dict[str, int]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {i.name: i.data_type for i in g.initializer}
    for vi in [*g.input, *g.value_info, *g.output]:
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    for node in g.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    types[node.output[0]] = attr.t.data_type
                elif attr.name in ("value_float", "value_floats"):
                    types[node.output[0]] = onnx.TensorProto.FLOAT
    return types


def _to_half(arr: np.ndarray) -> tuple[np.ndarray, int]:
    """float32 -> float16, values beyond FP16's range clipped (returns how many were)."""
    clipped = int(np.count_nonzero(np.abs(arr[np.isfinite(arr)]) > FP16_MAX))
    return np.clip(arr, -FP16_MAX, FP16_MAX).astype(np.float16), clipped


def mixed_fp16(model_path: Path, out: Path, *, keep_fp32: Sequence[str] = (), simulate: bool = False) -> dict[str, Any]:
    """Write an FP16 version of ``model_path`` to ``out``: inputs, outputs and ``keep_fp32`` nodes stay FP32.

    Every float tensor is produced in its node's type; a Cast is inserted on each edge whose producer and
    consumer types differ (one Cast per tensor and type, shared by consumers). Float initializers read by
    FP16 nodes get an FP16 copy. The result passes ``onnx.checker`` and strict shape inference.

    With ``simulate`` the model stays FP32 and instead rounds what FP16 would store: the weights of FP16
    nodes, every float output of an FP16 node and every float graph input an FP16 node reads (a Cast to FP16
    and back, which ONNX Runtime keeps, so values beyond 65504 become Inf as on the GPU). ONNX Runtime's CPU
    provider runs most FP16 ops by casting to FP32 and drops the casts between such ops, so the typed model
    alone would hide overflow.

    Returns:
        ``{"fp32_nodes": [...], "fp16_nodes": n, "casts": n, "clipped_weights": n}``.

    Raises:
        StageError: ``keep_fp32`` names unknown nodes, or the converted model does not check.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(model_path))
    graph = model.graph
    names = {n.name for n in graph.node}
    unknown = [n for n in keep_fp32 if n not in names]
    if unknown:
        raise StageError(
            "precision",
            f"nodes to keep in FP32 are not in the model: {', '.join(unknown[:5])}",
            hint="use node names from model.onnx (see precision.json)",
        )
    orig = _elem_types(model)
    outer = _subgraph_outer_reads(model)
    keep = set(keep_fp32)
    inits = {i.name: i for i in graph.initializer}
    current: dict[str, int] = {i.name: orig.get(i.name, 0) for i in graph.input}
    graph_inputs = {i.name for i in graph.input if i.name not in inits}
    current.update({name: orig.get(name, 0) for name in inits})
    casts: dict[tuple[str, int], str] = {}
    half_inits: dict[str, str] = {}
    new_nodes: list[Any] = []
    fp32_nodes: list[str] = []
    clipped = 0
    n_half = 0
    casts_added = [0]
    FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16

    def converted(name: str, want: int) -> str:
        nonlocal clipped
        if name in inits and want == HALF:
            if name not in half_inits:
                arr, c = _to_half(numpy_helper.to_array(inits[name]))
                clipped += c
                half_inits[name] = f"{name}__fp16"
                stored = arr.astype(np.float32) if simulate else arr
                graph.initializer.append(numpy_helper.from_array(stored, half_inits[name]))
            return half_inits[name]
        if simulate:  # activations are rounded where they are produced; graph inputs where an FP16 layer reads them
            if want != HALF or name not in graph_inputs:
                return name
            rounding: tuple[str, int] = (name, HALF)
            if rounding not in casts:  # one rounding per input, shared by its FP16 readers (the GPU stores it in FP16)
                casts[rounding] = f"{name}__input_rounded"
                new_nodes.extend(
                    [
                        helper.make_node("Cast", [name], [f"{name}__input_half"], name=f"{name}__round_Cast", to=HALF),
                        helper.make_node(
                            "Cast", [f"{name}__input_half"], [casts[rounding]], name=f"{name}__back_Cast", to=FLOAT
                        ),
                    ]
                )
            return casts[rounding]
        key = (name, want)
        if key not in casts:
            casts[key] = f"{name}__to_{'fp16' if want == HALF else 'fp32'}"
            new_nodes.append(helper.make_node("Cast", [name], [casts[key]], name=f"{casts[key]}_Cast", to=want))
        return casts[key]

    for node in graph.node:
        has_subgraph = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
        half = (
            node.name not in keep
            and node.op_type not in FP32_OPS
            and node.domain in ("", "ai.onnx")
            and not has_subgraph
            and not any(o in outer for o in node.output)
        )
        fixed = FLOAT32_INPUTS.get(node.op_type, frozenset()) if half else frozenset()
        for i, name in enumerate(node.input):
            if not name or orig.get(name) != FLOAT:
                continue
            want = HALF if half and i not in fixed else FLOAT
            have = current.get(name, FLOAT)
            if have != want:
                node.input[i] = converted(name, want)
        if half:
            n_half += 1
            if not simulate:
                _retype_attributes(node)
        else:
            fp32_nodes.append(node.name)
        rounded = []
        for i, o in enumerate(node.output):
            if o and orig.get(o) == FLOAT:
                current[o] = HALF if half and not simulate else FLOAT
                if half and simulate:
                    node.output[i] = f"{o}__exact"
                    rounded += [
                        helper.make_node("Cast", [f"{o}__exact"], [f"{o}__half"], name=f"{o}__round_Cast", to=HALF),
                        helper.make_node("Cast", [f"{o}__half"], [o], name=f"{o}__back_Cast", to=FLOAT),
                    ]
            elif o:
                current[o] = orig.get(o, 0)
        new_nodes.append(node)
        new_nodes.extend(rounded)
        casts_added[0] += len(rounded)

    # graph outputs keep their FP32 type: the producer writes <name>__fp16 and a final Cast restores <name>
    for out_vi in graph.output:
        name = out_vi.name
        if orig.get(name) != FLOAT or current.get(name) != HALF:
            continue
        renamed = f"{name}__fp16"
        for n in new_nodes:
            for i, x in enumerate(n.input):
                if x == name:
                    n.input[i] = renamed
            for i, x in enumerate(n.output):
                if x == name:
                    n.output[i] = renamed
        new_nodes.append(helper.make_node("Cast", [renamed], [name], name=f"{name}__to_fp32_Cast", to=FLOAT))

    del graph.node[:]
    graph.node.extend(new_nodes)
    del graph.value_info[:]
    used = {i for n in graph.node for i in n.input}
    kept_inits = [i for i in graph.initializer if i.name in used or i.name in {x.name for x in graph.output}]
    del graph.initializer[:]
    graph.initializer.extend(kept_inits)
    try:
        checked = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        onnx.checker.check_model(checked)
    except Exception as exc:  # onnx raises ValidationError / InferenceError
        raise StageError(
            "precision",
            f"FP16 conversion produced an invalid model: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
            hint="list the node named in the message in precision.keep_fp32",
        ) from None
    onnx.save(checked, str(out))
    return {
        "fp32_nodes": fp32_nodes,
        "fp16_nodes": n_half,
        "casts": len(casts) + casts_added[0] + sum(1 for o in graph.output if f"{o.name}__fp16" in used),
        "clipped_weights": clipped,
    }


def _retype_attributes(node: Any) -> None:
    """Float constants and casts inside an FP16 node produce FP16."""
    from onnx import TensorProto, numpy_helper

    for attr in node.attribute:
        if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
            attr.i = TensorProto.FLOAT16
        elif node.op_type in ("Constant", "ConstantOfShape") and attr.name == "value":
            if attr.t.data_type == TensorProto.FLOAT:
                arr, _ = _to_half(numpy_helper.to_array(attr.t))
                attr.t.CopyFrom(numpy_helper.from_array(arr, attr.t.name))
        elif node.op_type == "Constant" and attr.name in ("value_float", "value_floats"):
            arr = np.asarray(attr.f if attr.name == "value_float" else list(attr.floats), dtype=np.float32)
            half, _ = _to_half(arr)
            attr.CopyFrom(_tensor_attr(half))


def _tensor_attr(arr: np.ndarray) -> Any:
    from onnx import helper, numpy_helper

    return helper.make_attribute("value", numpy_helper.from_array(arr))


def single_float_output_nodes(model: ModelProto, nodes: Sequence[str]) -> set[str]:
    """Of ``nodes``, those with exactly one output, of type float32 (the ones whose output type can be pinned).

    TensorRT's output-type pin (``set_output_type`` / trtexec ``--layerOutputTypes``) only makes sense on float
    outputs; a node with index or shape outputs keeps its precision pin only.
    """
    import onnx

    types = _elem_types(model)
    wanted = set(nodes)
    return {
        n.name
        for n in model.graph.node
        if n.name in wanted and len(n.output) == 1 and types.get(n.output[0]) == onnx.TensorProto.FLOAT
    }


def first_nonfinite_layers(sim: Path, batches: Sequence[dict[str, np.ndarray]], workdir: Path) -> list[str]:
    """Layers to pin when the simulated FP16 model (:func:`mixed_fp16` with ``simulate=True``) gives NaN/Inf:
    the first layer (graph order) whose output is non-finite, if it runs in FP16, and the FP16 layers feeding
    it (an input flushed to 0 or rounded to Inf). Empty when no layer's output is non-finite."""
    import onnx

    from edgedeploy.precision import analysis

    stats = analysis.tensor_ranges(sim, batches, workdir)
    model = onnx.load(str(sim))
    ours = ("__round_Cast", "__back_Cast")
    producers = {o: n for n in model.graph.node for o in n.output}

    def origin(tensor: str) -> str | None:  # the FP16 layer behind a rounded tensor
        back = producers.get(tensor)
        if back is None or not back.name.endswith("__back_Cast"):
            return None
        return producers[producers[back.input[0]].input[0]].name

    for node in model.graph.node:
        if node.name.endswith(ours):
            continue
        if any(stats.get(o) is not None and stats[o].nonfinite for o in node.output):
            rounded_out = any(o.endswith("__exact") for o in node.output)
            feeders = [f for f in (origin(i) for i in node.input) if f]
            return list(dict.fromkeys(([node.name] if rounded_out else []) + feeders))
    return []
