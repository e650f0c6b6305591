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


def float_graph_outputs(path: Path) -> list[str]:
    """Rewrite the QDQ model at ``path`` so that each graph output fed by ``X -> QuantizeLinear ->
    DequantizeLinear`` is ``X`` itself (its producer writes the output name; the pair is removed).

    Only where the pair and ``X`` have no other reader. Returns the outputs made float (the file is rewritten
    only when there are any).
    """
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    readers = Counter(i for n in graph.node for i in n.input)
    readers.update(o.name for o in graph.output)
    made_float: list[str] = []
    dropped: set[int] = set()
    for output in graph.output:
        dq = producers.get(output.name)
        if dq is None or dq.op_type != "DequantizeLinear" or readers[output.name] != 1:
            continue
        q = producers.get(dq.input[0])
        if q is None or q.op_type != "QuantizeLinear" or readers[q.output[0]] != 1:
            continue
        source = q.input[0]
        node = producers.get(source)
        if node is None or readers[source] != 1:  # a graph input, or read by others too: leave it
            continue
        node.output[list(node.output).index(source)] = output.name
        dropped.update((id(q), id(dq)))
        made_float.append(output.name)
    if made_float:
        kept = [n for n in graph.node if id(n) not in dropped]
        del graph.node[:]
        graph.node.extend(kept)
        onnx.save(model, str(path))
    return made_float
