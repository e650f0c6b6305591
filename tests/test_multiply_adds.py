"""Multiply-add shares per node (onnxtools/macs.py) and the bisection stop rule built on them (speed_probe.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgedeploy.onnxtools.macs import multiply_add_shares
from edgedeploy.precision import speed_probe


def _model(path: Path) -> Path:
    """x[N,3,8,8] -> Conv 3->4 3x3 pad 1 -> Relu -> Flatten -> Gemm 256->10 (transB) -> MatMul 10->5."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(size=(10, 256)).astype(np.float32), "g"),
        numpy_helper.from_array(rng.normal(size=(10, 5)).astype(np.float32), "m"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "g"], ["h"], name="gemm", transB=1),
        helper.make_node("MatMul", ["h", "m"], ["y"], name="matmul"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])], inits,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_each_node_gets_its_share_of_the_multiply_adds_whatever_the_batch(tmp_path: Path) -> None:
    shares = multiply_add_shares(_model(tmp_path / "m.onnx"))
    conv, gemm, matmul = 4 * 8 * 8 * (3 * 3 * 3), 10 * 256, 5 * 10  # per sample: the batch dim is symbolic
    total = conv + gemm + matmul
    assert shares == pytest.approx({"conv": conv / total, "gemm": gemm / total, "matmul": matmul / total})
    assert "relu" not in shares and "flatten" not in shares  # no multiply-adds to speak of


def _clock(monkeypatch: pytest.MonkeyPatch, fp32_ms: float, int8_ms: float) -> list[list[Path]]:
    timed: list[list[Path]] = []

    def timer(feeds, *, rounds, iters):  # type: ignore[no-untyped-def]
        def run(models):  # type: ignore[no-untyped-def]
            timed.append(list(models))
            return [fp32_ms, int8_ms]

        return run

    monkeypatch.setattr(speed_probe, "side_by_side_timer", timer)
    return timed


def test_bisection_settles_when_the_undecided_nodes_cannot_save_the_timing_margin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(tmp_path / "m.onnx")
    shares = multiply_add_shares(model)
    timed = _clock(monkeypatch, fp32_ms=4.0, int8_ms=2.0)  # INT8 2x: a node saves its share of the INT8 time
    rule = speed_probe.undecided_too_small(model, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    int8 = tmp_path / "all.int8.onnx"
    assert shares["matmul"] < speed_probe.MARGIN < shares["gemm"]
    why = rule(["matmul", "relu"], int8)
    assert why is not None and why.startswith("the 2 node(s) still undecided hold 0.5% of the multiply-adds")
    assert "ms" not in why.replace("multiply", "")  # no timing in a reason that lands in hashed precision.json
    assert rule(["gemm"], int8) is None  # its share could pay for another try
    assert timed == [[model, int8]]  # FP32 against all-INT8, timed once for every question


@pytest.mark.parametrize(("fp32_ms", "int8_ms", "settles"), [(4.0, 4.0, True), (0.5, 0.2, False), (12.0, 1.5, False)])
def test_the_measured_speed_up_decides_what_the_undecided_nodes_could_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fp32_ms: float, int8_ms: float, settles: bool
) -> None:
    model = _model(tmp_path / "m.onnx")
    _clock(monkeypatch, fp32_ms, int8_ms)
    rule = speed_probe.undecided_too_small(model, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    # INT8 no faster: nothing to save, whatever the share; under MIN_MS: timer noise, bisect on; 8x: the
    # matmul's 0.5 % could save 3.7 %
    assert (rule(["matmul"], tmp_path / "all.int8.onnx") is not None) is settles
