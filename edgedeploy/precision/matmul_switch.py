"""Weight MatMuls of a quantized transformer put back in float by graph surgery, not by quantizing again.

ONNX Runtime's quantizers parse, quantize and write the whole model on every call: about 1 s for a 90 MB
MiniLM-class encoder on this machine, and the transformer recipe's sensitivity ranking quantized each of its
MatMuls alone (36 calls, each with its own file and session). Every model the recipe needs differs from the
one quantized first (every candidate MatMul INT8) only in which MatMuls are float, so they are made from it:

- :func:`float_matmuls`: the model with some MatMuls float (a fallback try): each one's quantized chain (the
  integer MatMul and its scale arithmetic on ONNX Runtime; the MatMul reading DequantizeLinear outputs on
  TensorRT's Q/DQ) is replaced by the float node, and the chain's nodes and weights nothing reads any more go;
- :func:`switch_model`: one model in which a boolean input per MatMul picks its INT8 or its float result
  (``Where``), so one session ranks every MatMul: each run switches one of them to INT8.

A MatMul's float node reads the float model's tensors by their names: its activation (the quantized graph
still computes it, the chain quantizes it) and its float weight (copied from the float model). On ONNX
Runtime's dynamic INT8 that is the quantizer's own model for the same set; in Q/DQ graphs a float MatMul reads
its input unquantized even where an INT8 MatMul beside it quantizes that tensor (query and key read one
LayerNorm output), where the quantizer would rewire it to the quantized copy.

Domain layer: onnx protos only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SWITCH_PREFIX = "__int8_switch_"  # the boolean graph input of each switched MatMul: true runs it in INT8


def derivable(quantized: Any, float_model: Any, nodes: Sequence[str]) -> bool:
    """Whether every node of ``nodes`` can be put back in float in ``quantized``: it is a node of
    ``float_model`` whose output ``quantized`` computes under the same name, and each of its inputs is a tensor
    of ``quantized`` (produced, a graph input or an initializer) or an initializer of ``float_model``."""
    float_nodes = {n.name: n for n in float_model.graph.node}
    produced = {o for n in quantized.graph.node for o in n.output}
    available = (
        produced
        | {i.name for i in quantized.graph.input}
        | {i.name for i in quantized.graph.initializer}
        | {i.name for i in float_model.graph.initializer}
    )
    for name in nodes:
        node = float_nodes.get(name)
        if node is None or len(node.output) != 1 or node.output[0] not in produced:
            return False
        if not all(i in available for i in node.input if i):
            return False
    return True


def float_matmuls(quantized: Any, float_model: Any, nodes: Sequence[str]) -> int:
    """Put ``nodes`` (names in ``float_model``, the model ``quantized`` was made from) back in float, in place:
    each node's output is computed by its float node again, and the nodes and initializers nothing reads any
    more are dropped. Check :func:`derivable` first. Returns the nodes replaced."""
    graph = quantized.graph
    float_nodes = {n.name: n for n in float_model.graph.node}
    replaced = 0
    for name in nodes:
        node = _float_copy(float_nodes[name], quantized, float_model)
        position, producer = _producer(graph, node.output[0])
        graph.node.remove(producer)
        graph.node.insert(position, node)
        replaced += 1
    _drop_unread(quantized)
    return replaced


def switch_model(quantized: Any, float_model: Any, nodes: Sequence[str]) -> dict[str, str]:
    """Make ``quantized`` (in place) compute each of ``nodes`` both ways and pick one per run: its INT8 result
    where the boolean scalar input ``gates[node]`` is true, its float node's result where false. Check
    :func:`derivable` first. Returns node -> gate input name; with every gate false the model computes what
    ``float_model`` does (up to kernel rounding), with one true what quantizing that node alone would."""
    import onnx

    graph = quantized.graph
    float_nodes = {n.name: n for n in float_model.graph.node}
    gates: dict[str, str] = {}
    for k, name in enumerate(nodes):
        node = _float_copy(float_nodes[name], quantized, float_model)
        result = node.output[0]
        position, producer = _producer(graph, result)
        int8, float_result, gate = f"{result}__int8", f"{result}__float", f"{SWITCH_PREFIX}{k}"
        producer.output[list(producer.output).index(result)] = int8
        node.name, node.output[0] = f"{name}__float", float_result
        pick = onnx.helper.make_node("Where", [gate, int8, float_result], [result], name=f"{name}__switch")
        graph.node.insert(position + 1, node)
        graph.node.insert(position + 2, pick)
        graph.input.append(onnx.helper.make_tensor_value_info(gate, onnx.TensorProto.BOOL, []))
        gates[name] = gate
    return gates


def _float_copy(node: Any, quantized: Any, float_model: Any) -> Any:
    """A copy of the float ``node``, with the float initializers it reads added to ``quantized`` (once)."""
    import onnx

    have = {i.name for i in quantized.graph.initializer}
    for init in float_model.graph.initializer:
        if init.name in node.input and init.name not in have:
            quantized.graph.initializer.append(init)
            have.add(init.name)
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def _producer(graph: Any, tensor: str) -> tuple[int, Any]:
    """(position, node) of the node of ``graph`` that writes ``tensor``."""
    for position, node in enumerate(graph.node):
        if tensor in node.output:
            return position, node
    raise ValueError(f"no node writes {tensor}")  # derivable() rules this out


def _drop_unread(model: Any) -> None:
    """Remove the nodes none of whose outputs is read (by a node or as a graph output), repeatedly, then the
    initializers nothing reads."""
    from edgedeploy.precision.float_subset import drop_unread_initializers_of, names_read

    graph = model.graph
    outputs = {o.name for o in graph.output}
    while True:
        read = names_read(graph) | outputs
        dead = [n for n in graph.node if not any(o in read for o in n.output if o)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    drop_unread_initializers_of(graph)
