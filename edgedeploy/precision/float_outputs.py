"""Graph outputs of a QDQ model stay float: no QuantizeLinear -> DequantizeLinear in front of them.

onnxruntime's quantizer quantizes every tensor it quantizes once, graph outputs included, so a classifier's
logits leave the model on a 256-level grid. Two logits closer than one step (EfficientNet-Lite0 on photo crops:
a tenth of the crops have a top-1/top-2 gap under 0.14, the logits' step is about 0.1) then round to the same
code or swap, and top-1 changes although every layer computed the same scores. Nothing downstream reads the
quantized output: ONNX Runtime's QGemm / QLinearConv and TensorRT's INT8 GEMM and convolution layers all write
a float output when no QuantizeLinear follows, so the last layer runs in INT8 either way and only the
rounding of its result goes. (TensorRT's own Q/DQ placement advice is the same: quantize the inputs of
weighted layers, not the network's outputs.)
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from edgedeploy.precision.analysis import QDQ_COMPUTE_OPS


def float_graph_outputs(path: Path) -> list[str]:
    """Rewrite the QDQ model at ``path`` so that each graph output fed by ``X -> QuantizeLinear ->
    DequantizeLinear`` is ``X`` itself (its producer writes the output name; the pair is removed).

    Where ``X`` has other readers too, the graph output is ``Identity(X)``. Other readers of the output (an
    ``ArgMax`` of the logits) read the float output too, so the outputs agree; layers that compute in INT8 from
    it keep the pair's (renamed) output. Returns the outputs made float (the file is rewritten only when there are any).
    """
    import onnx

    from edgedeploy.precision import model_files

    model = model_files.load(path)
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    readers = Counter(i for n in graph.node for i in n.input)
    readers.update(o.name for o in graph.output)
    made_float: list[str] = []
    dropped: set[int] = set()
    after: dict[int, onnx.NodeProto] = {}  # DequantizeLinear -> the Identity that follows it
    for output in graph.output:
        dq = producers.get(output.name)
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        q = producers.get(dq.input[0])
        if q is None or q.op_type != "QuantizeLinear":
            continue
        source = q.input[0]
        node = producers.get(source)
        # readers that compute in INT8 from the pair's output keep it; the others (an ArgMax of the logits) read
        # the float output, so the outputs agree with each other
        int8_readers = [n for n in graph.node if output.name in n.input and n.op_type in QDQ_COMPUTE_OPS]
        if int8_readers:  # INT8 layers read the pair's output too: they keep it, renamed
            quantized = f"{output.name}_quantized"
            dq.output[0] = quantized
            for reader in int8_readers:
                reader.input[:] = [quantized if name == output.name else name for name in reader.input]
        else:  # the pair's output is the graph output's alone: the pair goes
            dropped.add(id(dq))
            if readers[q.output[0]] == 1:
                dropped.add(id(q))
        if not int8_readers and node is not None and readers[source] == 1 and id(q) in dropped:
            # the producer writes the output (other readers of the name, an ArgMax, read its float result)
            node.output[list(node.output).index(source)] = output.name
        else:  # the source is a graph input, or read by others too: a copy of it is the output
            after[id(dq)] = onnx.helper.make_node("Identity", [source], [output.name], name=f"{output.name}_float")
        made_float.append(output.name)
    if made_float:
        kept = []
        for n in graph.node:
            if id(n) not in dropped:
                kept.append(n)
            if id(n) in after:
                kept.append(after[id(n)])
        del graph.node[:]
        graph.node.extend(kept)
        model_files.save(model, path)
    return made_float
