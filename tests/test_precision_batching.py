"""The precision stage's runs join many small batches into few ONNX Runtime calls only where every output follows
the batch: an output of another length (a count of detections) stays with the batch it came from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgedeploy.precision.analysis import run_model


def _model_with_a_count_output(path: Path, count_dim: str | None) -> None:
    """y = x (leading dim N); hits = the (row, column) of each positive entry of x (leading dim: their count)."""
    nodes = [
        helper.make_node("Identity", ["x"], ["y"]),
        helper.make_node("Greater", ["x", "zero"], ["positive"]),
        helper.make_node("NonZero", ["positive"], ["where"]),
        helper.make_node("Transpose", ["where"], ["hits"], perm=[1, 0]),
    ]
    graph = helper.make_graph(
        nodes,
        "count",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("hits", TensorProto.INT64, [count_dim, 2]),
        ],
        [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_an_output_that_does_not_follow_the_batch_is_never_split_among_joined_batches(tmp_path: Path) -> None:
    # one positive entry per one-row batch: joined, the two hits happen to be as many as the rows
    batches = [{"x": np.array([[1.0, 0.0, 0.0, 0.0]], np.float32)}, {"x": np.array([[0.0, 2.0, 0.0, 0.0]], np.float32)}]
    for count_dim in ("K", None):
        path = tmp_path / f"count_{count_dim}.onnx"
        _model_with_a_count_output(path, count_dim)
        joined = run_model(path, batches)
        alone = [run_model(path, [b])[0] for b in batches]
        for got, want in zip(joined, alone):
            np.testing.assert_array_equal(got["y"], want["y"])
            np.testing.assert_array_equal(got["hits"], want["hits"])  # each batch's own row 0
        assert joined[1]["hits"].tolist() == [[0, 1]]
