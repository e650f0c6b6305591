"""Multiply-adds per node of an ONNX model: where its compute is, as a share of the whole.

Counted for the ops whose cost is their multiply-adds (Conv, ConvTranspose, Gemm, MatMul), from the shapes
ONNX shape inference gives; a symbolic dim (the batch) counts as 1, so shares do not depend on it. Other ops
(element-wise, pooling, reshapes) count 0: they move memory rather than multiply.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

MAC_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def multiply_add_shares(model_path: Path) -> dict[str, float]:
    """Node name -> its share of the model's multiply-adds (the shares of the counted nodes sum to 1).

    Empty when no node's count is known (shapes that inference cannot give, no counted op).

    Raises:
        OSError: the model file cannot be read (shape inference itself is not strict: it raises nothing here).
    """
    import onnx
    from onnx import shape_inference

    model = shape_inference.infer_shapes(onnx.load(str(model_path)), strict_mode=False)
    graph = model.graph
    shapes: dict[str, list[int]] = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        dims = info.type.tensor_type.shape.dim
        shapes[info.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in dims]
    for init in graph.initializer:
        shapes[init.name] = list(init.dims)
    counts: dict[str, int] = {}
    for node in graph.node:
        if node.op_type not in MAC_OPS or not node.name:
            continue
        count = _multiply_adds(node, shapes)
        if count:
            counts[node.name] = count
    total = sum(counts.values())
    return {name: count / total for name, count in counts.items()} if total else {}


def _multiply_adds(node, shapes: dict[str, list[int]]) -> int:
    """One node's multiply-adds from its input and output shapes; 0 where a shape is unknown."""
    out = shapes.get(node.output[0])
    weights = shapes.get(node.input[1]) if len(node.input) > 1 else None
    if not out or not weights:
        return 0
    if node.op_type == "Conv":  # every output value: (input channels / group) x kernel window products
        return int(np.prod(out, dtype=np.int64) * np.prod(weights[1:], dtype=np.int64))
    if node.op_type == "ConvTranspose":  # every input value scattered over (output channels / group) x kernel
        data = shapes.get(node.input[0])
        return int(np.prod(data, dtype=np.int64) * np.prod(weights[1:], dtype=np.int64)) if data else 0
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        inner = weights[1] if trans_b else weights[0]
        return int(np.prod(out, dtype=np.int64) * inner)
    data = shapes.get(node.input[0])  # MatMul: the shared (contracted) dim is the first input's last
    return int(np.prod(out, dtype=np.int64) * data[-1]) if data else 0
