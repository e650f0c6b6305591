"""Learned weight rounding (edgedeploy/precision/adaround.py) on a tiny real depthwise CNN and real photo crops."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from test_calib_data import photo_folder
from test_precision import photo_batches
from test_precision_build import _normalized_project
from test_precision_equalize import _model

from edgedeploy.cli import main
from edgedeploy.precision import adaround
from edgedeploy.precision.quantize import Quantizer, flavour_for


def _weight_codes(qdq: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Quantized node -> (int8 codes, per-channel scale) of its weight DequantizeLinear."""
    model = onnx.load(str(qdq))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for n in model.graph.node:
        dq = producers.get(n.input[1]) if n.op_type in ("Conv", "Gemm") else None
        if dq is not None and dq.op_type == "DequantizeLinear":
            out[n.name] = (inits[dq.input[0]], inits[dq.input[1]])
    return out


def _snapped(float_model: Path, out: Path, result: adaround.RoundingResult) -> Path:
    """The float model with every rounded weight replaced by ``scale * code`` (values on ORT's grid)."""
    model = onnx.load(str(float_model))
    layers = {lay.weight: lay for lay in adaround.weighted_layers(model)}
    for init in model.graph.initializer:
        if init.name in result.codes:
            lay = layers[init.name]
            rows = lay.rows(result.codes[init.name].astype(np.float32))
            value = lay.unrows(rows * result.scales[init.name].reshape(rows.shape[0], rows.shape[1], 1))
            init.CopyFrom(numpy_helper.from_array(value.astype(np.float32), init.name))
    onnx.save(model, str(out))
    return out


@pytest.mark.parametrize(("per_channel", "reduce_range"), [(True, False), (False, False), (True, True)])
def test_learned_codes_sit_on_ort_grid_and_the_quantized_model_carries_them(
    tmp_path: Path, per_channel: bool, reduce_range: bool
) -> None:
    float_model = _model(tmp_path)
    batches = photo_batches(samples=16, batch=8)
    qmax = 64 if reduce_range else 127  # ORT's 7-bit weights: int8 in [-64, 64]
    (tmp_path / "q").mkdir()
    flavour = flavour_for("onnxruntime")
    q = Quantizer(float_model, tmp_path / "q", flavour, per_channel=per_channel, reduce_range=reduce_range)
    note = adaround.round_weights(q, batches, iters=200)
    result = q.weight_codes
    assert note["method"] == "adaround" and note["layers"] == 3
    convs = [n for n in onnx.load(str(float_model)).graph.node if n.op_type == "Conv"]
    assert set(result.codes) == {n.input[1] for n in convs}
    written = _weight_codes(q.quantize(tmp_path / "ada.int8.onnx", batches))
    for n in convs:
        codes, scale = written[n.name]
        np.testing.assert_array_equal(codes, result.codes[n.input[1]])
        ours = result.scales[n.input[1]]
        np.testing.assert_array_equal(np.broadcast_to(scale.reshape(-1), ours.shape), ours)  # ORT's formula
        assert np.abs(codes).max() <= qmax
    # the same grid from the other side: float weights snapped to scale * code, quantized by ORT's own
    # round-to-nearest, give back exactly those codes and scales (each channel's max |w| stays at +-qmax s)
    snapped = _snapped(float_model, tmp_path / "snapped.onnx", result)
    (tmp_path / "s").mkdir()
    plain = Quantizer(snapped, tmp_path / "s", flavour, per_channel=per_channel, reduce_range=reduce_range)
    again = _weight_codes(plain.quantize(tmp_path / "snapped.int8.onnx", batches))
    weights = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(float_model)).graph.initializer}
    flipped = 0
    for n in convs:
        codes, scale = again[n.name]
        np.testing.assert_array_equal(codes, result.codes[n.input[1]])
        ours = result.scales[n.input[1]]
        np.testing.assert_allclose(np.broadcast_to(scale.reshape(-1), ours.shape), ours, rtol=1e-6)
        nearest = np.clip(np.round(weights[n.input[1]] / ours.reshape(-1, 1, 1, 1)), -qmax, qmax)
        flipped += int((nearest != codes).sum())
    assert flipped > 0  # it learned something other than nearest rounding


def test_adaround_lowers_layer_output_error_on_data_it_never_saw(tmp_path: Path) -> None:
    float_model = _model(tmp_path)
    batches = photo_batches(samples=48, batch=8)
    train, unseen = batches[:3], batches[3:]
    (tmp_path / "q").mkdir()
    nearest = Quantizer(float_model, tmp_path / "q", flavour_for("onnxruntime"), reduce_range=False).quantize(
        tmp_path / "nearest.int8.onnx", train
    )
    result = adaround.learn_rounding(float_model, train, quantized_model=nearest, iters=200)
    assert all(r["error_learned"] <= r["error_nearest"] for r in result.layers if r["learned"])
    model = onnx.load(str(float_model))
    layers = adaround.weighted_layers(model)
    inits = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    stats = adaround.collect_stats(float_model, layers, unseen, quantized_model=nearest)
    totals = {"nearest": 0.0, "learned": 0.0}
    for lay in layers:
        w = lay.rows(inits[lay.weight])
        scale = result.scales[lay.weight].reshape(w.shape[0], w.shape[1], 1)
        near = np.clip(np.round(w / scale), -127, 127) * scale
        learned = lay.rows(result.codes[lay.weight].astype(np.float64)) * scale
        totals["nearest"] += adaround.output_error(w, near, stats[lay.node])
        totals["learned"] += adaround.output_error(w, learned, stats[lay.node])
    assert totals["learned"] < totals["nearest"], totals


def test_gemm_and_grouped_layers_are_read_per_output_channel() -> None:
    from onnx import TensorProto, helper

    w = np.arange(24, dtype=np.float32).reshape(4, 6)  # Gemm transB=0: (in 4, out 6)
    conv = np.zeros((6, 2, 3, 3), np.float32)  # 3 groups of 2 output channels over 2 input channels each
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "c"], ["y"], name="conv", group=3, pads=[1, 1, 1, 1]),
            helper.make_node("Gemm", ["v", "w"], ["z"], name="fc"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 5, 5]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(conv, "c")],
    )  # fmt: skip
    layers = {lay.node: lay for lay in adaround.weighted_layers(helper.make_model(graph))}
    fc, cv = layers["fc"], layers["conv"]
    assert fc.rows(w).shape == (1, 6, 4) and np.array_equal(fc.rows(w)[0, 1], w[:, 1])
    np.testing.assert_array_equal(fc.unrows(fc.rows(w)), w)
    assert cv.rows(conv).shape == (3, 2, 18) and cv.pads == (1, 1, 1, 1)
    scales = adaround.weight_scales(fc.rows(w)[0])
    np.testing.assert_allclose(scales, np.abs(w).max(0) / 127, rtol=1e-6)


@pytest.mark.parametrize("value", ["adaround", "nearest"])
def test_stage_records_weight_rounding_and_learns_on_calibration_batches_only(
    tiny_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    from edgedeploy.precision import data

    seen: list[int] = []
    real = adaround.collect_stats

    def spy(float_model, layers, batches, quantized_model=None):
        seen.extend(id(b) for b in batches)
        return real(float_model, layers, batches, quantized_model)

    held_ids: list[int] = []
    real_split = data.split_heldout

    def split(batches, *args, **kwargs):
        calib, held = real_split(batches, *args, **kwargs)
        held_ids.extend(id(b) for b in held)
        return calib, held

    monkeypatch.setattr(adaround, "collect_stats", spy)
    monkeypatch.setattr(data, "split_heldout", split)
    cfg = _normalized_project(tiny_project)
    calib = photo_folder(tmp_path / "photos", count=12, size=40)
    out = tmp_path / "out"
    argv = ["build", "--config", str(cfg), "--out", str(out), "--target", "cpu", "--precision", "int8"]
    assert main([*argv, "--calib", str(calib), "--weight-rounding", value]) == 0
    plan = json.loads((out / "precision.json").read_text())
    assert plan["weight_rounding"]["method"] == value
    if value == "adaround":
        assert seen and held_ids and not set(seen) & set(held_ids)
        assert plan["weight_rounding"]["layers"] >= 1
    else:
        assert not seen


def test_weight_rounding_key_is_validated(tiny_project: Path) -> None:
    from edgedeploy.config import load_config
    from edgedeploy.errors import ConfigError

    tiny_project.write_text(tiny_project.read_text() + '\n[precision]\nweight_rounding = "stochastic"\n')
    with pytest.raises(ConfigError, match="precision.weight_rounding"):
        load_config(tiny_project)


def test_sequential_rounding_feeds_learned_codes_to_later_layers(tmp_path: Path) -> None:
    float_model = _model(tmp_path)
    batches = photo_batches(samples=16, batch=8)
    (tmp_path / "q").mkdir()
    nearest = Quantizer(float_model, tmp_path / "q", flavour_for("onnxruntime"), reduce_range=False).quantize(
        tmp_path / "nearest.int8.onnx", batches
    )
    at_once = adaround.learn_rounding(float_model, batches, quantized_model=nearest, iters=60)
    seq = adaround.learn_rounding(float_model, batches, quantized_model=nearest, sequential=1, iters=60)
    assert [r["node"] for r in seq.layers] == [r["node"] for r in at_once.layers]
    # the first layer's input does not depend on any rounding: the same statistics either way
    assert seq.layers[0]["error_nearest"] == pytest.approx(at_once.layers[0]["error_nearest"], rel=1e-6)
    # later layers read inputs computed with the learned codes upstream: different statistics
    assert seq.layers[-1]["error_nearest"] != pytest.approx(at_once.layers[-1]["error_nearest"], rel=1e-6)


def test_auto_learns_the_rounding_only_when_round_to_nearest_misses_the_target(
    tiny_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = adaround.round_weights

    def spy(q, batches, **kwargs):
        calls.append(len(batches))
        return real(q, batches, **kwargs)

    monkeypatch.setattr(adaround, "round_weights", spy)
    cfg = _normalized_project(tiny_project)
    # judged by cosine (top-1 of this tiny net agrees whatever the rounding): a target can be out of reach
    cfg.write_text(cfg.read_text().replace('classifier_outputs = ["logits"]', "classifier_outputs = []"))
    calib = photo_folder(tmp_path / "photos", count=12, size=40)
    argv = ["build", "--config", str(cfg), "--target", "cpu", "--precision", "int8", "--calib", str(calib)]
    assert main([*argv, "--out", str(tmp_path / "met")]) == 0  # "auto" is the default
    plan = json.loads((tmp_path / "met" / "precision.json").read_text())
    assert plan["weight_rounding"]["method"] == "nearest" and not calls
    assert plan["weight_rounding"]["why"].startswith("auto: round-to-nearest first")
    assert plan["search_ladder"]["stop"] == "target met at rung a"  # AdaRound is rung c's: not run
    # a target round-to-nearest cannot meet: the rounding is learned (whatever the build's outcome)
    cfg.write_text(cfg.read_text() + "\n[precision]\naccuracy_target = 0.99999999\nmax_fallback_tries = 1\n")
    main([*argv, "--out", str(tmp_path / "missed")])
    assert len(calls) == 1 and calls[0] >= 1
