"""Cross-layer equalization and bias correction (edgedeploy/precision/equalize.py) on a tiny real ONNX model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_calib_cache import export_onnx
from test_calib_data import photo_folder
from test_precision import photo_batches
from test_precision_build import _normalized_project

from edgedeploy.cli import main
from edgedeploy.precision import analysis
from edgedeploy.precision import equalize as eq
from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess


def depthwise_net():
    """conv -> ReLU6 -> depthwise conv -> ReLU -> conv, with channel ranges spread over 100x (as BN folding does)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU6(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8),
        nn.ReLU(),
        nn.Conv2d(8, 4, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )
    with torch.no_grad():
        spread = torch.logspace(-1, 1, 8)
        net[0].weight.mul_(spread.view(-1, 1, 1, 1))
        net[2].weight.mul_(spread.flip(0).view(-1, 1, 1, 1) * 3)
    return net


def _model(tmp_path: Path) -> Path:
    x = photo_batches(samples=8, batch=8)[0]["image"]
    raw = export_onnx(depthwise_net(), x, tmp_path / "raw.onnx")
    return preprocess(raw, tmp_path / "float.onnx")


def _ranges(path: Path) -> list[np.ndarray]:
    from onnx import numpy_helper

    m = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    return [eq.channel_ranges(inits[n.input[1]], 0) for n in m.graph.node if n.op_type == "Conv"]


def test_equalization_keeps_fp32_outputs_and_equalizes_channel_ranges(tmp_path: Path) -> None:
    float_model = _model(tmp_path)
    assert eq.has_depthwise_conv(onnx.load(str(float_model)))
    report = eq.equalize(float_model, tmp_path / "cle.onnx")
    assert len(report.pairs) == 2 and report.clips_rewritten == 1  # conv->relu6->dw, dw->relu->conv
    batches = photo_batches(samples=16, batch=8)
    before = analysis.run_model(float_model, batches)
    after = analysis.run_model(tmp_path / "cle.onnx", batches)
    for a, b in zip(before, after):
        assert np.abs(a["logits"] - b["logits"]).max() < 1e-4 * max(1.0, float(np.abs(a["logits"]).max()))
    ops = [n.op_type for n in onnx.load(str(tmp_path / "cle.onnx")).graph.node]
    assert "Clip" not in ops and "Min" in ops  # ReLU6 became Relu + per-channel Min (exact under scaling)
    # the first two convs' per-channel weight ranges: spread (max/min) drops by an order of magnitude
    old, new = _ranges(float_model), _ranges(tmp_path / "cle.onnx")
    for o, n in zip(old[:2], new[:2]):
        assert eq.spread(n) < eq.spread(o) / 10
    assert report.range_spread_after < report.range_spread_before


def test_bias_correction_moves_quantized_conv_means_back_to_float(tmp_path: Path) -> None:
    float_model = _model(tmp_path)
    batches = photo_batches(samples=16, batch=8)
    q = Quantizer(float_model, tmp_path, flavour_for("onnxruntime"), reduce_range=False)
    plain = q.quantize(tmp_path / "plain.int8.onnx", batches)
    shutil.copyfile(plain, tmp_path / "bc.int8.onnx")
    means = eq.conv_input_means(float_model, batches)
    assert set(means) == {n.name for n in onnx.load(str(float_model)).graph.node if n.op_type == "Conv"}
    assert eq.correct_bias(tmp_path / "bc.int8.onnx", float_model, means) == 3
    ref = np.concatenate([o["logits"] for o in analysis.run_model(float_model, batches)])
    mean_err = {
        name: abs(float((np.concatenate([o["logits"] for o in analysis.run_model(p, batches)]) - ref).mean()))
        for name, p in (("plain", plain), ("bc", tmp_path / "bc.int8.onnx"))
    }
    assert mean_err["bc"] < mean_err["plain"]


def test_stage_applies_equalization_when_configured(tiny_project: Path, tmp_path: Path) -> None:
    cfg = _normalized_project(tiny_project)
    calib = photo_folder(tmp_path / "photos", count=12, size=40)
    out = tmp_path / "out"
    argv = ["build", "--config", str(cfg), "--out", str(out), "--target", "cpu", "--precision", "int8"]
    assert main([*argv, "--calib", str(calib), "--equalize", "true"]) == 0
    plan = json.loads((out / "precision.json").read_text())
    assert plan["equalize"]["applied"] is True and plan["equalize"]["why"] == "precision.equalize = true"
    assert "bias_correction" in plan["equalize"]
    assert main([*argv, "--calib", str(calib), "--equalize", "false"]) == 0
    plan = json.loads((out / "precision.json").read_text())
    assert plan["equalize"] == {"applied": False, "why": "precision.equalize = false"}
    assert main([*argv, "--calib", str(calib)]) == 0  # auto: the tiny project has no depthwise conv
    assert json.loads((out / "precision.json").read_text())["equalize"]["why"] == "auto: no depthwise convs"


def test_equalize_flag_parses_auto_and_booleans() -> None:
    from edgedeploy.config_flags import flag_fields, parse_flag_value

    ff = next(f for f in flag_fields() if f.flag == "--equalize")
    assert [parse_flag_value(ff, t) for t in ("auto", "true", "off")] == ["auto", True, False]


def test_activation_equalization_levels_depthwise_input_channels_exactly(tmp_path: Path) -> None:
    float_model = _model(tmp_path)
    batches = photo_batches(samples=16, batch=8)
    peaks = {k: v[1] for k, v in eq.conv_input_stats(float_model, batches).items()}
    dw = next(n.name for n in onnx.load(str(float_model)).graph.node if n.op_type == "Conv" and eq._group(n) > 1)
    assert eq.spread(peaks[dw]) > 2
    eq.equalize(float_model, tmp_path / "act.onnx", input_peaks=peaks, weight_pairs=False, max_scale=1e3)
    for a, b in zip(analysis.run_model(float_model, batches), analysis.run_model(tmp_path / "act.onnx", batches)):
        assert np.abs(a["logits"] - b["logits"]).max() < 1e-4 * max(1.0, float(np.abs(a["logits"]).max()))
    after = eq.conv_input_stats(tmp_path / "act.onnx", batches)[dw][1]
    live = peaks[dw] >= peaks[dw].max() / 1e3  # channels the scale clamp (max_scale) lets reach the top
    assert live.sum() >= 4 and np.allclose(after[live], after.max(), rtol=1e-3)  # all span the same range now


def test_auto_measures_plain_bias_corrected_and_equalized_and_keeps_the_best(tmp_path: Path) -> None:
    from edgedeploy.config import PrecisionSection
    from edgedeploy.precision.equalize_choice import choose_equalization

    float_model = _model(tmp_path)
    batches = photo_batches(samples=24, batch=8)
    for method in ("outputs", "weights"):
        work = tmp_path / method
        work.mkdir()
        section = PrecisionSection(bias_correction=method)
        model, note, bias = choose_equalization(
            "auto", float_model, batches[:2], batches[2:], work, flavour_for("onnxruntime"), section, []
        )
        assert note["why"] == "auto: depthwise convs found, measured"
        assert set(note["measured"]) == {"plain", "bias_corrected", "equalized"}
        best = note["chosen"]
        assert note["measured"][best] == max(note["measured"].values())
        assert note["applied"] == (best == "equalized")
        assert (model != float_model) == (best == "equalized")
        corrected = bias.outputs if method == "outputs" else bias.means is not None
        assert corrected == (best != "plain")
        assert note["bias_correction"] == {"applied": best != "plain", "method": method}
        if method == "outputs" and best != "plain":  # measured on the naive model, handed to the final one
            assert bias.shifts


def test_auto_keeps_the_cheapest_accurate_candidate_without_measuring_the_others(tmp_path: Path) -> None:
    """Bias correction alone meeting the target ends the choice: no plain or CLE model is quantized or scored,
    and the ranges calibrated for it are the ones the final quantizer reuses."""
    from edgedeploy.config import PrecisionSection
    from edgedeploy.precision.equalize_choice import choose_equalization
    from edgedeploy.precision.quantize import Quantizer

    float_model = _model(tmp_path)
    batches = photo_batches(samples=24, batch=8)
    work = tmp_path / "work"
    work.mkdir()
    model, note, bias = choose_equalization(
        "auto", float_model, batches[:2], batches[2:], work, flavour_for("onnxruntime"), PrecisionSection(), [],
        target=0.5,
    )  # fmt: skip
    assert list(note["measured"]) == ["bias_corrected"] and note["measured"]["bias_corrected"] >= 0.5
    assert note["chosen"] == "bias_corrected" and "bias correction alone met the target" in note["why"]
    assert model == float_model and bias.outputs and not (work / "eq_equalized.int8.onnx").exists()
    final = Quantizer(float_model, tmp_path, flavour_for("onnxruntime"))
    final.adopt_ranges(bias.calibrated)
    assert (tmp_path / "ort_ranges.json").read_bytes() == (bias.calibrated / "ort_ranges.json").read_bytes()


def test_relu6_bound_runs_on_the_integers_with_identical_outputs(tmp_path: Path) -> None:
    import dataclasses

    float_model = _model(tmp_path)
    eq.equalize(float_model, tmp_path / "cle.onnx")
    batches = photo_batches(samples=16, batch=8)
    # a flavour of another name: the quantizer leaves the float DequantizeLinear -> Min -> QuantizeLinear chain
    flavour = dataclasses.replace(flavour_for("onnxruntime"), name="U8S8-float-min")
    q = Quantizer(tmp_path / "cle.onnx", tmp_path, flavour, reduce_range=False)
    chain = q.quantize(tmp_path / "chain.int8.onnx", batches)
    shutil.copyfile(chain, tmp_path / "int.int8.onnx")
    assert eq.integer_clip_bounds(tmp_path / "int.int8.onnx") == 1
    m = onnx.load(str(tmp_path / "int.int8.onnx"))
    producers = {o: n.op_type for n in m.graph.node for o in n.output}
    mins = [n for n in m.graph.node if n.op_type == "Min"]
    assert len(mins) == 1 and producers[mins[0].input[0]] == "QuantizeLinear"
    for a, b in zip(analysis.run_model(chain, batches), analysis.run_model(tmp_path / "int.int8.onnx", batches)):
        np.testing.assert_array_equal(a["logits"], b["logits"])


def _conv_output_means(model_path: Path, batches) -> dict[str, np.ndarray]:
    from edgedeploy.precision.bias_correction import float_output_means

    convs = [n.name for n in onnx.load(str(model_path)).graph.node if n.op_type == "Conv"]
    return float_output_means(model_path, convs, batches)


def test_output_bias_correction_matches_every_conv_output_mean_layer_by_layer(tmp_path: Path) -> None:
    """After the correction the quantized model's conv outputs have the float model's means on the calibration
    data (layer by layer, so downstream convs see the corrected upstream ones), far closer than before."""
    from edgedeploy.precision.bias_correction import apply_bias_shifts, output_mean_shifts

    float_model = _model(tmp_path)
    batches = photo_batches(samples=16, batch=8)
    q = Quantizer(float_model, tmp_path, flavour_for("onnxruntime"), reduce_range=False)
    plain = q.quantize(tmp_path / "plain.int8.onnx", batches)
    shutil.copyfile(plain, tmp_path / "corrected.int8.onnx")
    shifts = output_mean_shifts(tmp_path / "corrected.int8.onnx", float_model, batches)
    assert set(shifts) == {n.name for n in onnx.load(str(float_model)).graph.node if n.op_type == "Conv"}
    assert apply_bias_shifts(tmp_path / "corrected.int8.onnx", shifts) == len(shifts)
    want = _conv_output_means(float_model, batches)
    before = _conv_output_means(plain, batches)
    after = _conv_output_means(tmp_path / "corrected.int8.onnx", batches)
    for conv, mean in want.items():
        scale = float(np.abs(mean).max()) + 1e-3
        err_before = float(np.abs(before[conv] - mean).max()) / scale
        err_after = float(np.abs(after[conv] - mean).max()) / scale
        # what is left: int32 bias rounding and the integer kernels' requantization (measured 10-120x smaller)
        assert err_after < err_before / 5, (conv, err_before, err_after)


def test_output_shifts_in_one_pass_equal_the_conv_by_conv_loop(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from edgedeploy.precision import bias_correction

    float_model = _model(tmp_path)
    batches = photo_batches(samples=16, batch=8)
    q = Quantizer(float_model, tmp_path, flavour_for("onnxruntime"), reduce_range=False)
    plain = q.quantize(tmp_path / "plain.int8.onnx", batches)
    one_pass = bias_correction.output_mean_shifts(plain, float_model, batches)  # equal batches: joined, one run
    monkeypatch.setattr(bias_correction, "joined", lambda b: b)  # two batches: one run per conv and batch
    loop = bias_correction.output_mean_shifts(plain, float_model, batches)
    assert set(one_pass) == set(loop) and len(loop) >= 2
    for conv, shift in loop.items():
        np.testing.assert_allclose(one_pass[conv], shift, rtol=1e-3, atol=1e-5 * (np.abs(shift).max() + 1))


def test_output_shifts_skip_convs_the_fallback_kept_in_float(tmp_path: Path) -> None:
    from onnx import numpy_helper

    float_model = _model(tmp_path)
    batches = photo_batches(samples=16, batch=8)
    convs = [n.name for n in onnx.load(str(float_model)).graph.node if n.op_type == "Conv"]
    q = Quantizer(float_model, tmp_path, flavour_for("onnxruntime"), reduce_range=False)
    q.output_bias_correction = True
    q.quantize(tmp_path / "naive.int8.onnx", batches)
    assert q.output_shifts and set(q.output_shifts) == set(convs)
    kept = q.quantize(tmp_path / "kept.int8.onnx", batches, exclude=[convs[1]])
    # measured again for this float set (the naive model's shifts would over-correct), without the float conv
    assert q.output_shifts_for == (convs[1],) and set(q.output_shifts) == set(convs) - {convs[1]}
    model = onnx.load(str(kept))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.name == convs[1])
    float_inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(float_model)).graph.initializer}
    float_node = next(n for n in onnx.load(str(float_model)).graph.node if n.name == convs[1])
    np.testing.assert_array_equal(inits[node.input[2]], float_inits[float_node.input[2]])  # bias untouched


def test_calibration_pass_gives_bias_correction_its_float_means(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The histogram pass already fetches every conv output: bias correction takes the float means from it (the
    same means a float run of its own measures) and runs no float model; other batches measure again."""
    from edgedeploy.precision import bias_correction

    float_model = _model(tmp_path)
    batches = photo_batches(samples=6, batch=1)  # the stage's layout: one sample per batch, joined for the means
    q = Quantizer(float_model, tmp_path, flavour_for("onnxruntime"), reduce_range=False)
    q.output_bias_correction = True
    q.calibrate(batches)
    convs = [n.name for n in onnx.load(str(float_model)).graph.node if n.op_type == "Conv"]
    assert set(q.float_conv_means) == set(convs)
    measured = _conv_output_means(float_model, bias_correction.joined(batches))
    for conv in convs:
        np.testing.assert_allclose(q.float_conv_means[conv], measured[conv], rtol=1e-5, atol=1e-6)

    def no_float_run(*_args, **_kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the float model was run again")

    real = bias_correction.float_output_means
    monkeypatch.setattr(bias_correction, "float_output_means", no_float_run)
    q.quantize(tmp_path / "naive.int8.onnx", batches)
    assert set(q.output_shifts or {}) == set(convs)
    other = [{k: v.copy() for k, v in b.items()} for b in batches]  # equal values, other arrays: measured again
    with pytest.raises(AssertionError, match="run again"):
        q.quantize(tmp_path / "other.int8.onnx", other, exclude=[convs[0]])
    monkeypatch.setattr(bias_correction, "float_output_means", real)
    shifts_given = dict(q.output_shifts or {})
    q.output_shifts = None
    q.quantize(tmp_path / "again.int8.onnx", other)  # the shifts a float run of its own gives
    for conv, shift in (q.output_shifts or {}).items():
        np.testing.assert_allclose(shifts_given[conv], shift, rtol=1e-4, atol=1e-6 * (np.abs(shift).max() + 1))
