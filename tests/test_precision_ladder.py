"""The INT8 search as a ladder: the cheapest candidate first (all INT8, bias correction, round-to-nearest), then
the fewest worst-ranked nodes float (ranked by one quantization per node, in one pass on large graphs), the
expensive steps (CLE measured, AdaRound, the wide search) only when those miss; explicit settings still run what
they ask."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_calib_cache import export_onnx
from test_precision import _stage_ctx, outlier_net, photo_batches

from edgedeploy.precision import adaround, analysis, equalize, fallback
from edgedeploy.precision.layer_error import layer_errors
from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess


def depthwise_net():
    """A small depthwise-separable CNN (stem, depthwise, pointwise, ReLU6s): the kind CLE applies to."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU6(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8),
        nn.ReLU6(),
        nn.Conv2d(8, 8, 1),
        nn.ReLU6(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )


@pytest.fixture
def expensive_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often these steps ran: AdaRound, CLE, the one-quantization-per-node sensitivity ranking."""
    calls = {"adaround": 0, "cle": 0, "trial_sensitivity": 0}

    def counted(name: str, real):  # type: ignore[no-untyped-def]
        def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls[name] += 1
            return real(*args, **kwargs)

        return spy

    monkeypatch.setattr(adaround, "round_weights", counted("adaround", adaround.round_weights))
    monkeypatch.setattr(equalize, "equalize", counted("cle", equalize.equalize))
    monkeypatch.setattr(fallback, "layer_sensitivity", counted("trial_sensitivity", fallback.layer_sensitivity))
    return calls


def _plan(tmp_path: Path, model, precision: dict | None = None) -> dict:  # type: ignore[no-untyped-def]
    from edgedeploy.stages.precision import PrecisionFromOnnx

    ctx = _stage_ctx(tmp_path, "cpu", "int8", model, precision)
    return PrecisionFromOnnx().run(ctx).metrics


def test_a_model_the_cheapest_rung_serves_stops_there(tmp_path: Path, expensive_calls: dict[str, int]) -> None:
    plan = _plan(tmp_path, depthwise_net())
    ladder = plan["search_ladder"]
    assert ladder["stop"] == "target met at rung a"
    a, b, c = ladder["rungs"]
    assert a["ran"] and a["met"] and list(a["measured"]) == ["cosine"]
    assert not b["ran"] and b["why"].startswith("not needed")
    assert not c["ran"] and c["why"].startswith("not needed") and "adaround" in c["steps"]
    assert len(plan["fallback_tries"]) == 1 and plan["kept_float"] == []
    # bias correction on the unmodified model, unmeasured; CLE and AdaRound never ran
    assert plan["equalize"]["chosen"] == "bias_corrected" and "measured" not in plan["equalize"]
    assert plan["weight_rounding"]["method"] == "nearest"
    assert plan["weight_rounding"]["why"].startswith("auto: round-to-nearest first")
    assert expensive_calls == {"adaround": 0, "cle": 0, "trial_sensitivity": 0}


@pytest.mark.parametrize("ranked", ["one quantization per node", "one pass"])
def test_a_model_that_misses_at_rung_a_meets_the_target_through_the_ranking(
    tmp_path: Path, expensive_calls: dict[str, int], monkeypatch: pytest.MonkeyPatch, ranked: str
) -> None:
    if ranked == "one pass":  # what graphs past TRIAL_RANKING_MAX quantized nodes are ranked by
        monkeypatch.setattr("edgedeploy.stages.precision.TRIAL_RANKING_MAX", 0)
    plan = _plan(tmp_path, outlier_net())  # one activation channel 1000x the rest: all-INT8 misses cosine 0.99
    ladder = plan["search_ladder"]
    a, b, c = ladder["rungs"]
    assert not a["met"] and a["measured"]["cosine"] < 0.99
    assert b["ran"] and b["met"] and 1 <= b["float_nodes"] <= 2 and b["measured"]["cosine"] >= 0.99
    assert ladder["stop"] == "target met at rung b" and not c["ran"]
    kept = {k["node"] for k in plan["kept_float"]}
    assert "/c2/Conv" in kept and kept <= {"/c2/Conv", "/Mul"}  # the outlier tensor's consumer first
    assert plan["sensitivity"][0]["node"] == "/c2/Conv"
    if ranked == "one pass":
        assert all("own output on the calibration batches" in k["why"] for k in plan["kept_float"])
        assert "sqnr_db" in plan["sensitivity"][0]
    else:
        assert all("quantizing this" in k["why"] for k in plan["kept_float"]), plan["kept_float"]
        assert "output_error" in plan["sensitivity"][0]
    assert plan["fallback_choice"]["rule"] == "first family to pass"  # nothing timed in rung b
    trials = 1 if ranked == "one quantization per node" else 0
    assert expensive_calls == {"adaround": 0, "cle": 0, "trial_sensitivity": trials}


def test_explicit_settings_still_run_what_they_ask(tmp_path: Path, expensive_calls: dict[str, int]) -> None:
    plan = _plan(tmp_path, depthwise_net(), {"weight_rounding": "adaround", "equalize": True})
    assert plan["search_ladder"]["stop"] == "target met at rung a"
    assert plan["weight_rounding"]["method"] == "adaround" and plan["weight_rounding"]["layers"] >= 1
    assert plan["equalize"]["applied"] and plan["equalize"]["why"] == "precision.equalize = true"
    assert expensive_calls["adaround"] == 1 and expensive_calls["cle"] == 1


def test_rung_c_runs_only_when_the_cheaper_rungs_miss_and_says_what_it_ran(
    tmp_path: Path, expensive_calls: dict[str, int]
) -> None:
    # a target only (nearly) all-float sets reach: rung b spends its one try on a short float prefix, rung c
    # learns AdaRound, ranks, and spends its one try where the ranking says the miss is removed
    plan = _plan(tmp_path, depthwise_net(), {"accuracy_target": 0.99999999, "max_fallback_tries": 1})
    b, c = plan["search_ladder"]["rungs"][1:]
    assert b["ran"] and not b["met"] and c["ran"] and c["met"], plan["search_ladder"]
    assert plan["fallback_start"]["size"] > 1 and plan["fallback_start"]["predicted"] >= plan["fallback_start"]["size"]
    assert expensive_calls["adaround"] == 1 and expensive_calls["cle"] == 1
    # on cpu rung b spends its one try on a float prefix and ranks nothing it could not try; rung c ranks the
    # equalized model
    assert expensive_calls["trial_sensitivity"] == 1


def test_layer_errors_rank_the_outlier_consumer_first_in_one_pass(tmp_path: Path) -> None:
    import onnx

    batches = photo_batches(16, 8)
    path = export_onnx(outlier_net(), batches[0]["image"], tmp_path / "outlier.onnx")
    q = Quantizer(preprocess(path, tmp_path / "float.onnx"), tmp_path, flavour_for("onnxruntime"))
    naive = q.quantize(tmp_path / "naive.int8.onnx", batches)
    candidates = analysis.quantized_nodes(onnx.load(str(naive)))
    rows = layer_errors(naive, q.float_model, batches, tmp_path, candidates)
    assert {r["node"] for r in rows} == set(candidates)
    assert rows[0]["node"] == "/c2/Conv" and rows[0]["output_error"] > 100 * rows[1]["output_error"]
    # the stem conv writes the Relu's tensor in the QDQ model: compared after the same Relu, a small error
    stem = next(r for r in rows if r["node"] == "/c1/Conv")
    assert stem["output_error"] < 1e-3 and stem["sqnr_db"] > 30
    assert all(np.isfinite(r["output_error"]) for r in rows)


def test_held_out_goldens_come_from_batched_reference_calls_equal_to_one_call_each() -> None:
    from edgedeploy.precision.analysis import JoinedCalls
    from edgedeploy.precision.golden_feeds import batch_groups

    rng = np.random.default_rng(0)
    views = [{"image": rng.standard_normal((1, 3, 4, 4)).astype(np.float32)} for _ in range(10)]
    views.append({"image": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)})  # another shape: its own group
    calls: list[int] = []

    def reference(feeds: dict, point: str) -> dict:
        calls.append(len(feeds["image"]))
        x = feeds["image"]
        return {"logits": x.reshape(len(x), -1)[:, :5] * 2.0, "pooled": x.mean(axis=(1, 2, 3))}

    groups = batch_groups(views, 4)
    assert [len(g) for g in groups] == [4, 4, 2, 1]  # at most the declared max batch a call
    joined = JoinedCalls(lambda feeds: reference(feeds, "calib-heldout"))
    got = [out for g in groups for out in joined(g)]
    assert calls == [4, 1, 4, 2, 1]  # the first group's last view alone once: joining changes nothing here
    for feeds, out in zip(views, got):
        one = reference(feeds, "calib-heldout")
        assert out.keys() == one.keys() and all(np.array_equal(out[k], one[k]) for k in one)


@pytest.mark.parametrize(("dear_speed", "ships"), [(1.5, "c"), (0.7, "b")])
def test_a_rung_b_model_no_faster_than_fp32_sends_the_search_to_rung_c(
    tmp_path: Path, expensive_calls: dict[str, int], monkeypatch: pytest.MonkeyPatch, dear_speed: float, ships: str
) -> None:
    """Rung b met the target but its float nodes left it no faster than FP32: rung c runs, and its model ships
    only when it also meets the target and runs faster. (The speeds are set here: timings are not asserted.)"""
    speeds = iter([0.8, dear_speed])
    monkeypatch.setattr("edgedeploy.stages.precision._measured_speedup", lambda _latency: next(speeds))
    plan = _plan(tmp_path, outlier_net())
    ladder = plan["search_ladder"]
    b, c = ladder["rungs"][1:]
    assert b["met"] and c["ran"] and c["why"] == "rung b met the target but runs at 0.80x FP32 here"
    assert expensive_calls["adaround"] == 1
    if ships == "c":
        assert ladder["stop"] == "target met at rung c, 1.50x FP32 where rung b ran 0.80x"
    else:
        assert ladder["stop"] == "target met at rung b; rung c found no faster model that meets it"
        assert plan["accuracy"]["float_nodes"] == b["float_nodes"]
