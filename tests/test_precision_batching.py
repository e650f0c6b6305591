"""The precision stage's runs join many small batches into few ONNX Runtime calls only where every output follows
the batch: an output of another length (a count of detections) stays with the batch it came from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgedeploy.precision.analysis import JoinedCalls, run_model, same_outputs


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


def test_hits_named_like_the_batch_but_not_from_it_are_caught_by_running_a_batch_alone(tmp_path: Path) -> None:
    # one positive entry per row: as many hits as rows whatever the call, and the output even declares the batch
    # symbol; only the values (the row index of each hit) tell the joined call from each batch alone
    path = tmp_path / "count_as_batch.onnx"
    _model_with_a_count_output(path, "N")
    batches = [{"x": np.eye(4, dtype=np.float32)[i : i + 1]} for i in range(4)]
    joined = run_model(path, batches)
    for got, batch in zip(joined, batches):
        np.testing.assert_array_equal(got["hits"], run_model(path, [batch])[0]["hits"])
    assert [g["hits"].tolist() for g in joined] == [[[0, i]] for i in range(4)]


def test_joined_calls_check_once_then_keep_to_what_they_found() -> None:
    calls: list[int] = []

    def centred(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # rows that see each other
        calls.append(len(feeds["x"]))
        return {"y": feeds["x"] - feeds["x"].mean(axis=0, keepdims=True)}

    def doubled(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # rows on their own
        calls.append(len(feeds["x"]))
        return {"y": feeds["x"] * 2}

    group = [{"x": np.full((1, 3), float(i), np.float32)} for i in range(3)]
    alone = [centred(b) for b in group]
    calls.clear()
    run = JoinedCalls(centred)
    for got, want in zip(run(group) + run(group), alone + alone):
        np.testing.assert_array_equal(got["y"], want["y"])
    assert run.trusted is False and calls == [3, 1, 1, 1, 1, 1, 1, 1]  # joined, checked, then each alone
    calls.clear()
    run = JoinedCalls(doubled)
    assert [r["y"][0, 0] for r in run(group) + run(group)] == [0.0, 2.0, 4.0] * 2
    assert run.trusted is True and calls == [3, 1, 3]  # joined and checked once, then joined


def test_same_outputs_allows_kernel_noise_and_nothing_more() -> None:
    want = {"y": np.array([[1.0, -2.0, 100.0]], np.float32), "k": np.array([3], np.int64)}
    noisy = {"y": want["y"] * (1 + 1e-6), "k": want["k"].copy()}
    assert same_outputs(noisy, want)
    assert not same_outputs({"y": want["y"] + np.float32(1.0), "k": want["k"]}, want)
    assert not same_outputs({"y": want["y"], "k": want["k"] + 1}, want)
    assert not same_outputs({"y": want["y"][:, :2], "k": want["k"]}, want)
