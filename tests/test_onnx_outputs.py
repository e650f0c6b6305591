"""Output naming after export (collisions with internal tensors) and declared output shapes that tell the truth."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgedeploy.onnxtools.outputs import declared_shape_problems, fix_declared_shapes, rename_outputs
from edgedeploy.onnxtools.shapes import ProbePoint


def _model(out_dims: list[int | str]) -> onnx.ModelProto:
    """x[batch, width] -> Relu -> 'embedding' (internal) -> Identity -> graph output 'out0'."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "width"])
    y = helper.make_tensor_value_info("out0", TensorProto.FLOAT, out_dims)
    nodes = [helper.make_node("Relu", ["x"], ["embedding"]), helper.make_node("Identity", ["embedding"], ["out0"])]
    graph = helper.make_graph(nodes, "g", [x], [y])
    graph.value_info.append(helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [2, 8]))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_output_named_like_an_internal_tensor_is_renamed_safely() -> None:
    model = _model(["batch", "width"])
    moved = rename_outputs(model, ["embedding"])
    assert moved == ["embedding"]
    assert [o.name for o in model.graph.output] == ["embedding"]
    onnx.checker.check_model(model, full_check=True)  # SSA holds: the internal value moved aside
    produced = [o for n in model.graph.node for o in n.output]
    assert produced.count("embedding") == 1 and "embedding__internal" in produced


def _points() -> tuple[list[ProbePoint], list[dict[str, np.ndarray]]]:
    dims = [{"batch": 2, "width": 8}, {"batch": 1, "width": 8}, {"batch": 2, "width": 16}]
    points = [ProbePoint("opt", dims[0]), ProbePoint("batch=1 (min)", dims[1], "batch"), ProbePoint("w", dims[2])]
    refs = [{"out0": np.zeros((d["batch"], d["width"]), np.float32)} for d in dims]
    return points, refs


def test_varying_static_dim_and_wrong_expression_become_symbols() -> None:
    points, refs = _points()
    model = _model([2, "32*((width//64))"])
    assert declared_shape_problems(model, points, refs)  # as exported: both dims lie somewhere
    figures = fix_declared_shapes(model, points, refs)
    assert figures["made_symbolic"] == ["out0[0]: 2"]
    assert figures["replaced_expressions"] == ["out0[1]: 32*((width//64))"]
    assert declared_shape_problems(model, points, refs) == []
    assert len(model.graph.value_info) == 0  # stale example-shaped intermediates dropped


def test_true_expressions_are_kept_and_a_constant_contradiction_is_reported() -> None:
    points, refs = _points()
    model = _model(["batch", "width"])
    assert fix_declared_shapes(model, points, refs) == {"made_symbolic": [], "replaced_expressions": []}
    wrong = _model(["batch", 9])
    fix_declared_shapes(wrong, points[:2], refs[:2])  # width never varies here: 9 stays static, and is wrong
    problems = declared_shape_problems(wrong, points[:2], refs[:2])
    assert problems and "output 'out0' dim 1 is declared 9 but is 8" in problems[0]
