"""precision.weight_rounding = auto keeps learned rounding only when it scores higher on held-out data
(edgedeploy/precision/rounding_choice.py), on a tiny real depthwise CNN and real photo crops."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from test_precision import photo_batches
from test_precision_equalize import _model

from edgedeploy.precision import adaround, analysis
from edgedeploy.precision.fallback import quantize_with_fallback
from edgedeploy.precision.quantize import Quantizer, flavour_for
from edgedeploy.precision.rounding_choice import choose_rounding


def _setup(tmp_path: Path) -> tuple[Quantizer, list, list, list]:
    float_model = _model(tmp_path)
    batches = photo_batches(samples=32, batch=8)
    calib, judge = batches[:3], batches[3:]
    (tmp_path / "q").mkdir()
    q = Quantizer(float_model, tmp_path / "q", flavour_for("onnxruntime"), reduce_range=False)
    q.output_bias_correction = True
    return q, calib, judge, analysis.run_model(float_model, judge)


def _weights(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name.endswith("_quantized")}


def test_auto_keeps_nearest_when_the_learned_codes_score_lower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q, calib, judge, reference = _setup(tmp_path)
    real = adaround.learn_rounding

    def sabotaged(*args, **kwargs):  # codes flipped in sign: a rounding that must lose on held-out data
        result = real(*args, **{**kwargs, "iters": 20})
        result.codes = {k: -v for k, v in result.codes.items()}
        return result

    monkeypatch.setattr(adaround, "learn_rounding", sabotaged)
    note, first = choose_rounding(
        "auto", q, calib, judge, reference, exclude=[], target=1.01, classifier_outputs=["logits"],
        workdir=tmp_path,
    )  # fmt: skip
    assert note["method"] == "nearest"
    assert note["measured"]["learned"] < note["measured"]["nearest"]
    assert "nearest kept" in note["why"] and note["adaround"]["layers"] >= 1
    assert q.weight_codes is None and q.output_shifts_for == ()  # the nearest model's own bias shifts again
    # what later tries build is the round-to-nearest model, not the sabotaged one
    after = _weights(q.quantize(tmp_path / "after.int8.onnx", calib))
    plain = Quantizer(q.float_model, tmp_path, flavour_for("onnxruntime"), reduce_range=False)
    plain.output_bias_correction = True
    nearest = _weights(plain.quantize(tmp_path / "plain.int8.onnx", calib))
    assert after.keys() == nearest.keys() and after
    assert first is not None  # the fallback search's try 0: the nearest model auto scored, as later tries build it
    returned = _weights(first)
    for name in after:
        np.testing.assert_array_equal(after[name], nearest[name])
        np.testing.assert_array_equal(returned[name], nearest[name])


def test_auto_learns_nothing_when_nearest_meets_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q, calib, judge, reference = _setup(tmp_path)
    called: list[int] = []
    monkeypatch.setattr(adaround, "learn_rounding", lambda *a, **k: called.append(1))
    note, first = choose_rounding(
        "auto", q, calib, judge, reference, exclude=[], target=0.0, classifier_outputs=["logits"], workdir=tmp_path
    )
    assert note["method"] == "nearest" and note["why"].startswith("auto: round-to-nearest met the target")
    assert not called and q.weight_codes is None
    # the fallback search scores that model as its try 0 instead of quantizing it again
    quantized: list[Path] = []
    real_quantize = q.quantize
    monkeypatch.setattr(q, "quantize", lambda out, *a, **k: quantized.append(out) or real_quantize(out, *a, **k))
    result = quantize_with_fallback(
        q, out=tmp_path / "final.int8.onnx", batches=calib, eval_batches=judge, classifier_outputs=["logits"],
        accuracy_target=0.0, max_tries=0, first_try=first,
    )  # fmt: skip
    assert result.met and len(result.tries) == 1 and not quantized
    assert (tmp_path / "final.int8.onnx").read_bytes() == first.read_bytes()


def test_adaround_setting_learns_without_scoring_nearest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q, calib, judge, reference = _setup(tmp_path)
    runs: list[str] = []
    real_run = analysis.run_model
    monkeypatch.setattr(analysis, "run_model", lambda path, b, **kw: runs.append(str(path)) or real_run(path, b, **kw))
    real = adaround.learn_rounding
    monkeypatch.setattr(adaround, "learn_rounding", lambda *a, **k: real(*a, **{**k, "iters": 20}))
    note, first = choose_rounding(
        "adaround", q, calib, judge, reference, exclude=[], target=1.01, classifier_outputs=["logits"],
        workdir=tmp_path,
    )  # fmt: skip
    assert note["method"] == "adaround" and "measured" not in note and first is None
    assert q.weight_codes is not None and not runs


def test_auto_says_adaround_has_nothing_to_learn_in_a_conv1d_model(tmp_path: Path) -> None:
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv1d(4, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv1d(8, 2, 1)).eval()
    float_model = tmp_path / "conv1d.onnx"
    torch.onnx.export(net, (torch.zeros(2, 4, 16),), str(float_model), input_names=["x"], dynamo=False)
    rng = np.random.default_rng(0)
    batches = [{"x": np.sin(rng.uniform(0, 6, (2, 4, 16))).astype(np.float32)} for _ in range(6)]
    calib, judge = batches[:4], batches[4:]
    (tmp_path / "q").mkdir()
    q = Quantizer(float_model, tmp_path / "q", flavour_for("onnxruntime"), reduce_range=False)
    note, first = choose_rounding(
        "auto", q, calib, judge, analysis.run_model(float_model, judge), exclude=[], target=1.01,
        classifier_outputs=[], workdir=tmp_path,
    )  # fmt: skip
    assert note["method"] == "nearest" and "adaround has no layer to learn" in note["why"]
    assert "adaround learned" not in note["why"] and set(note["measured"]) == {"nearest"}
    assert q.weight_codes is None and first is not None and first.exists()
