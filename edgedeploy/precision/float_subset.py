"""A QDQ model with more nodes float, made from one already quantized: graph surgery, not a new quantization.

ONNX Runtime's ``quantize_static`` recomputes every weight's per-channel scales and integers in Python on each
call (about 1 s for EfficientNet-Lite0 on an idle core, 11 calls in one search). A float-fallback try and a
speed-probe model differ from the model quantized first only by which nodes stay float, so they are made from
it: each node to keep float reads the float tensors again (its weights and bias from the float model, its
activations from before their QuantizeLinear), and the Q/DQ pairs no node reads any more are dropped.

Where the quantizer folded a ReLU / Clip into the range of the QuantizeLinear after a conv (the conv then
writes its pre-activation values under the activation's output name), a float reader gets a copy of that
activation (from the float model), as in :func:`edgedeploy.precision.quantize.bypass_qdq_into_float_nodes`.

Domain layer: onnx protos only.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def derivable(qdq_model: Any, nodes: Collection[str]) -> bool:
    """Whether every node of ``nodes`` is in ``qdq_model`` under its own name (a quantizer may remove nodes it
    folded, e.g. a Clip after a conv: such a set is quantized afresh, not derived)."""
    names = {n.name for n in qdq_model.graph.node}
    return all(n in names for n in nodes)


def keep_float(qdq_model: Any, float_model: Any, nodes: Collection[str]) -> int:
    """Make ``nodes`` of ``qdq_model`` (in place) read float inputs: the float model's initializers for their
    quantized weights and biases, the unquantized tensor for each activation read through a Q/DQ pair; then
    drop the DequantizeLinear and QuantizeLinear nodes nothing reads any more.

    ``float_model`` is the model ``qdq_model`` was quantized from (same node names). Returns the number of
    inputs rewired.
    """
    import onnx

    graph = qdq_model.graph
    wanted = set(nodes)
    float_nodes = {n.name: n for n in float_model.graph.node}
    float_producers = {o: n for n in float_model.graph.node for o in n.output}
    float_inits = {i.name: i for i in float_model.graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    init_names = {i.name for i in graph.initializer}
    taken = set(producers) | init_names | {i.name for i in graph.input}
    restored: dict[str, str] = {}  # pre-activation tensor -> its re-applied activation's output
    added: list[Any] = []  # activation copies, placed before the first node that reads them
    rewired = 0

    def float_initializer(name: str) -> str:
        init = float_inits[name]
        if name in init_names:
            return name
        fresh = name if name not in taken else f"{name}__float"
        if fresh not in init_names:
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = fresh
            graph.initializer.append(copy)
            init_names.add(fresh)
            taken.add(fresh)
        return fresh

    def unquantized(tensor: str) -> str:
        """The float tensor a DequantizeLinear output stands for (an activation re-applied where folded)."""
        dq = producers[tensor]
        q = producers.get(dq.input[0])
        if q is None or q.op_type != "QuantizeLinear":
            return tensor  # a DQ of a constant that is not a weight of this node: left as it is
        x = q.input[0]
        act, now = float_producers.get(x), producers.get(x)
        if act is None or now is None or act.op_type == now.op_type:
            return x
        if x not in restored:  # the quantizer folded this activation into the QuantizeLinear's range
            copy = reapplied_activation(act, x)
            restored[x] = copy.output[0]
            for i, extra in enumerate(copy.input[1:], start=1):
                if extra and extra in float_inits:
                    copy.input[i] = float_initializer(extra)
            added.append(copy)
        return restored[x]

    for node in graph.node:
        if node.name not in wanted:
            continue
        original = float_nodes.get(node.name)
        for i, tensor in enumerate(node.input):
            dq = producers.get(tensor)
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            if dq.input[0] in init_names and original is not None and i < len(original.input):
                source = original.input[i]  # a quantized weight or bias: the float model's own initializer
                if source in float_inits:
                    node.input[i] = float_initializer(source)
                    rewired += 1
                    continue
            node.input[i] = unquantized(tensor)
            rewired += 1
    if added:
        _insert_before_readers(graph, added)
    drop_unread_qdq(graph)
    return rewired


def _insert_before_readers(graph: Any, added: list[Any]) -> None:
    """Put each new node right after its input's producer (the graph stays topologically sorted)."""
    after: dict[str, list[Any]] = {}
    for node in added:
        after.setdefault(node.input[0], []).append(node)
    ordered: list[Any] = []
    for node in graph.node:
        ordered.append(node)
        for out in node.output:
            ordered.extend(after.pop(out, []))
    for nodes in after.values():  # inputs of the graph itself
        ordered[:0] = nodes
    del graph.node[:]
    graph.node.extend(ordered)


def drop_unread_qdq(graph: Any) -> None:
    """Remove Q/DQ nodes whose outputs nobody reads (DQ first, then the Q it was the last reader of); their
    initializers go with :func:`edgedeploy.precision.quantize.drop_unread_initializers`."""
    outputs = {o.name for o in graph.output}
    while True:
        read = names_read(graph) | outputs
        dead = [n for n in graph.node if n.op_type in QDQ_OPS and not any(o in read for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)


def drop_unread_initializers_of(graph: Any) -> list[str]:
    """Remove the initializers of ``graph`` that no node reads and no graph output names; returns their names."""
    read = names_read(graph) | {o.name for o in graph.output}
    unread = [init for init in graph.initializer if init.name not in read]
    for init in unread:
        graph.initializer.remove(init)
    return [init.name for init in unread]


def names_read(graph: Any) -> set[str]:
    """Every tensor name a node of ``graph`` or of a subgraph in it reads (subgraphs read outer names too)."""
    import onnx

    names: set[str] = set()
    for node in graph.node:
        names.update(node.input)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names |= names_read(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    names |= names_read(g)
    return names


def reapplied_activation(act: Any, x: str) -> Any:
    """A copy of the float model's activation node ``act`` (ReLU, Clip) that reads ``x``, the pre-activation
    values a conv writes where the quantizer folded ``act`` into a QuantizeLinear's range, and writes
    ``x + "__float_act"`` for a float reader. Its other inputs (Clip's bounds) keep their names."""
    import onnx

    copy = onnx.NodeProto()
    copy.CopyFrom(act)
    copy.name = f"{act.name}__float"
    copy.input[0] = x
    copy.output[0] = f"{x}__float_act"
    return copy
