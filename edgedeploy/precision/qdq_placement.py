"""Q/DQ placement for TensorRT: the INT8 graph shaped so TensorRT's fusions survive.

ONNX Runtime's QDQ quantizer puts a Quantize/Dequantize pair on every activation tensor it quantizes, inputs
and outputs alike. TensorRT reads Q/DQ nodes as placement orders (explicit quantization): it fuses a layer with
its neighbour only where no Q/DQ pair sits between them. NVIDIA's recommendations (TensorRT developer guide,
"Q/DQ Layer-Placement Recommendations"; ModelOpt's ONNX PTQ places them the same way):

- quantize the inputs of weighted layers, not their outputs: a pair between a convolution and its activation
  (Relu, Clip/ReLU6, Sigmoid, HardSigmoid, HardSwish, LeakyRelu, the Sigmoid*x of SiLU) blocks the
  conv+activation fusion; the activation's output is quantized instead, for the next weighted layer;
- in a residual Add, quantize the skip input only: the convolution on the other input then fuses with the Add
  (and its activation) into one INT8 kernel with a float residual read;
- leave global pooling's input and the classifier head float: TensorRT runs them float (the head as a tiny
  GEMM, the pooling as a reduction), and an INT8 head would round near-tie logits to one code.

:func:`float_nodes_for_tensorrt` names the nodes the quantizer leaves float (pooling, head); after quantizing,
:func:`place_for_tensorrt` removes the pairs on conv->activation edges and on the fusable input of every
residual Add. :func:`placement_findings` checks a graph against the same rules (the tests use it).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgedeploy.precision.float_subset import drop_unread_qdq

WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
ACTIVATIONS = ("Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Selu", "Tanh", "Softplus")
GATES = ("Sigmoid", "HardSigmoid")  # x * gate(x): SiLU / HardSwish written as two nodes
POOLS = ("GlobalAveragePool", "GlobalMaxPool", "ReduceMean")


@dataclass
class Placement:
    """What :func:`place_for_tensorrt` changed: edges made float, by reason (``producer -> consumer``)."""

    conv_activation: list[str] = field(default_factory=list)
    residual_add: list[str] = field(default_factory=list)
    float_inputs: list[str] = field(default_factory=list)  # inputs of nodes TensorRT runs float (pooling)

    def to_dict(self) -> dict[str, Any]:
        return {
            "conv_activation_edges": len(self.conv_activation),
            "residual_add_inputs": len(self.residual_add),
            "float_node_inputs": len(self.float_inputs),
        }


class _Graph:
    """Producer / consumer look-ups over an ONNX graph's nodes (rebuilt after each edit)."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.inits = {i.name for i in graph.initializer}
        self.producer = {o: n for n in graph.node for o in n.output}
        self.consumers: dict[str, list[Any]] = {}
        for n in graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)

    def through_qdq(self, tensor: str) -> tuple[str, bool]:
        """The float tensor behind ``tensor`` (through one activation DQ <- Q pair) and whether there was one."""
        dq = self.producer.get(tensor)
        if dq is None or dq.op_type != "DequantizeLinear":
            return tensor, False
        q = self.producer.get(dq.input[0])
        if q is None or q.op_type != "QuantizeLinear":
            return tensor, False  # a weight's DQ (int8 initializer): not an activation pair
        return q.input[0], True

    def readers(self, tensor: str) -> list[Any]:
        """The nodes reading ``tensor``'s value: directly, or through its Q -> DQ pairs."""
        out = []
        for c in self.consumers.get(tensor, []):
            if c.op_type != "QuantizeLinear":
                out.append(c)
                continue
            for dq in self.consumers.get(c.output[0], []):
                out.extend(self.consumers.get(dq.output[0], []) if dq.op_type == "DequantizeLinear" else [dq])
        return out

    def op_of(self, tensor: str) -> str:
        node = self.producer.get(tensor)
        return node.op_type if node is not None else ""

    def is_activation(self, node: Any, source: str) -> bool:
        """Whether ``node`` applies an activation to ``source`` (a plain activation, or x * gate(x))."""
        if node.op_type in ACTIVATIONS:
            return True
        if node.op_type == "Mul" and len(node.input) == 2:
            for inp in node.input:
                src, _ = self.through_qdq(inp)
                gate = self.producer.get(src)
                if gate is not None and gate.op_type in GATES and self.through_qdq(gate.input[0])[0] == source:
                    return True
        return False

    def is_residual_add(self, node: Any) -> bool:
        """An Add of two computed tensors of the same producer chain (not a bias or constant)."""
        if node.op_type != "Add" or len(node.input) != 2:
            return False
        return all(self.through_qdq(i)[0] not in self.inits and self.through_qdq(i)[0] for i in node.input)


def float_nodes_for_tensorrt(model: Any) -> dict[str, str]:
    """Nodes TensorRT runs float, so the quantizer leaves them float: global pooling and the head.

    The head is a Gemm/MatMul whose output reaches a graph output through shape-only ops (Flatten, Reshape,
    Squeeze, Softmax); a pooling node counts when it reduces a whole feature map (global pool, ReduceMean).
    """
    graph = model.graph
    outputs = {o.name for o in graph.output}
    consumers: dict[str, list[Any]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    passthrough = ("Flatten", "Reshape", "Squeeze", "Softmax", "Identity", "Cast")

    def reaches_output(tensor: str, depth: int = 0) -> bool:
        if tensor in outputs:
            return True
        if depth > 4:
            return False
        return any(
            c.op_type in passthrough and reaches_output(c.output[0], depth + 1) for c in consumers.get(tensor, [])
        )

    out: dict[str, str] = {}
    for n in graph.node:
        if n.op_type in POOLS and n.name:
            out[n.name] = "TensorRT: global pooling runs float (no Q/DQ on its input)"
        elif n.op_type in ("Gemm", "MatMul") and n.name and reaches_output(n.output[0]):
            out[n.name] = "TensorRT: the classifier head stays float"
    return out


def _fusable_add_input(g: _Graph, add: Any) -> int | None:
    """Index of the Add input whose producer TensorRT fuses with the Add (a weighted layer read only here)."""
    best: int | None = None
    for idx, inp in enumerate(add.input):
        src, quantized = g.through_qdq(inp)
        producer = g.producer.get(src)
        if not quantized or producer is None or producer.op_type not in WEIGHTED:
            continue
        readers = g.readers(src)
        if len(readers) == 1 and best is None:  # the conv feeds this Add alone: the fusion candidate
            best = idx
    return best


def place_for_tensorrt(path: Path, float_nodes: Iterable[str] = ()) -> Placement:
    """Rewrite the Q/DQ model at ``path`` to NVIDIA's placement (see the module docstring); the nodes named
    in ``float_nodes`` (:func:`float_nodes_for_tensorrt`) read their inputs without Q/DQ.

    Edges lose their pair only by rewiring the consumer to the float tensor; a pair no longer read is dropped.
    The model is rewritten only when anything changed.
    """

    from edgedeploy.precision import model_files

    model = model_files.load(path)
    g = _Graph(model.graph)
    placed = Placement()
    floats = set(float_nodes)
    for node in list(model.graph.node):
        if node.name in floats:
            for idx, inp in enumerate(node.input):
                src, quantized = g.through_qdq(inp)
                if quantized:
                    placed.float_inputs.append(f"{g.producer[src].name} -> {node.name}")
                    node.input[idx] = src
            continue
        if g.is_residual_add(node):
            fused = _fusable_add_input(g, node)
            if fused is not None:
                src, _ = g.through_qdq(node.input[fused])
                placed.residual_add.append(f"{g.producer[src].name} -> {node.name}")
                node.input[fused] = src
            continue
        for idx, inp in enumerate(node.input):
            src, quantized = g.through_qdq(inp)
            if not quantized:
                continue
            if _activation_edge(g, node, src):
                placed.conv_activation.append(f"{g.producer[src].name} -> {node.name}")
                node.input[idx] = src
    if placed.conv_activation or placed.residual_add or placed.float_inputs:
        drop_unread_qdq(model.graph)
        model_files.save(model, path)
    return placed


def _activation_edge(g: _Graph, node: Any, src: str) -> bool:
    """Whether float tensor ``src`` -> ``node`` is a conv->activation edge (or the gate -> Mul edge inside one)."""
    producer_op = g.op_of(src)
    if producer_op in WEIGHTED:
        return g.is_activation(node, src)
    if producer_op in GATES and node.op_type == "Mul":
        return g.is_activation(node, g.through_qdq(g.producer[src].input[0])[0])
    return False


def placement_findings(model: Any, kept_float: Collection[str] = ()) -> dict[str, list[str]]:
    """Where ``model``'s Q/DQ pairs break the rules above: conv->activation edges with a pair, residual Adds
    whose inputs are both quantized while one comes from a conv read only there, and residual Adds with no
    quantized input at all (the skip input must stay quantized), unless the Add is one of ``kept_float`` (the
    float fallback's nodes: a float Add reads float inputs). Empty lists: placed as NVIDIA recommends."""
    g = _Graph(model.graph)
    found: dict[str, list[str]] = {"conv_activation_qdq": [], "add_both_quantized": [], "add_skip_float": []}
    floats = set(kept_float)
    for node in model.graph.node:
        if g.is_residual_add(node):
            paired = [g.through_qdq(i)[1] for i in node.input]
            if all(paired) and _fusable_add_input(g, node) is not None:
                found["add_both_quantized"].append(node.name)
            elif not any(paired) and node.name not in floats:
                found["add_skip_float"].append(node.name)
            continue
        for inp in node.input:
            src, quantized = g.through_qdq(inp)
            if quantized and _activation_edge(g, node, src):
                found["conv_activation_qdq"].append(f"{g.producer[src].name} -> {node.name}")
    return found
