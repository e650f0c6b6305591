"""One judge for reduced precision: FP16/INT8 agreement on real samples, never a float model labelled INT8."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_calib_cache import export_onnx
from test_calib_data import photo_folder
from test_precision import photo_batches
from test_precision_build import _normalized_project
from test_precision_float_subset import residual_net
from test_precision_speed_probe import _timings

from edgedeploy.cli import main
from edgedeploy.device import complete_bundle as device
from edgedeploy.precision import analysis, speed_probe
from edgedeploy.precision.heldout import cosine_score
from edgedeploy.validate.parity import compare_output, judge_goldens, where

INT8 = {"atol": None, "rtol": None, "min_cosine": 0.98, "min_topk_agreement": 0.95}


def _noisy(ref: np.ndarray, scale: float, seed: int = 0) -> np.ndarray:
    return (ref + scale * np.random.default_rng(seed).standard_normal(ref.shape)).astype(np.float32)


def _cases() -> tuple[list[Any], list[dict[str, np.ndarray]]]:
    """A spec-random golden whose INT8 output is far off (cosine ~0.7) and a real-sample golden that agrees."""
    rng = np.random.default_rng(1)
    random_ref = rng.standard_normal((2, 16)).astype(np.float32)
    real_ref = rng.standard_normal((2, 16)).astype(np.float32)
    cases = [("opt", 0, {"out": {"emb": random_ref}}), ("data", 0, {"out": {"emb": real_ref}})]
    return cases, [{"emb": _noisy(random_ref, 1.0)}, {"emb": _noisy(real_ref, 0.01)}]


def test_spec_random_goldens_are_informational_for_int8_and_judged_for_fp32() -> None:
    cases, got = _cases()
    rows = judge_goldens(cases, got, "int8", INT8, outputs=["emb"])
    random_row, real_row = rows
    assert random_row["passed"] and random_row["agreement_judged"] is False
    assert random_row["informational"].startswith("cosine:") and random_row["cosine"] < 0.98
    assert real_row["passed"] and real_row["agreement_judged"] is True
    fp32 = {"atol": 1e-4, "rtol": 1e-3, "min_cosine": 0.9999, "min_topk_agreement": None}
    assert not judge_goldens(cases, got, "fp32", fp32, outputs=["emb"])[0]["passed"]
    # a real sample that disagrees fails, named as a real sample with its check
    bad = judge_goldens(cases, [got[0], {"emb": _noisy(cases[1][2]["out"]["emb"], 1.0)}], "int8", INT8)
    assert not bad[1]["passed"] and where(bad[1]) == "real sample data#0" and bad[1]["reason"].startswith("cosine")
    # no real-sample golden at all (FP16 without data): the spec-random ones are all the evidence there is
    alone = judge_goldens(cases[:1], got[:1], "fp16", {"min_cosine": 0.999})
    assert not alone[0]["passed"] and alone[0]["agreement_judged"]


def test_non_finite_and_shape_fail_on_spec_random_goldens_of_int8() -> None:
    cases, got = _cases()
    nan = got[0]["emb"].copy()
    nan[0, 0] = np.nan
    rows = judge_goldens(cases, [{"emb": nan}, got[1]], "int8", INT8)
    assert not rows[0]["passed"] and rows[0]["failure"] == ["non-finite output"]
    rows = judge_goldens(cases, [{"emb": got[0]["emb"][:1]}, got[1]], "int8", INT8)
    assert not rows[0]["passed"] and rows[0]["failure"] == ["shape mismatch"]


def test_cosine_is_na_on_tiny_or_zero_outputs_not_zero() -> None:
    one = compare_output(np.array([0.3], np.float32), np.array([0.0], np.float32), min_cosine=0.98)
    assert one["cosine"] is None and one["passed"] and "1 element" in one["cosine_na"]
    zero = compare_output(np.zeros(8, np.float32), np.full(8, 1e-3, np.float32), min_cosine=0.98)
    assert zero["cosine"] is None and zero["passed"] and "zero" in zero["cosine_na"]
    # held out: a one-value-per-sample output (a speech probability) is judged by one cosine over all samples,
    # about the reference's mean: following its variation is what counts, not sharing its offset
    ref = np.linspace(0.1, 0.9, 20, dtype=np.float32).reshape(20, 1)
    pooled = cosine_score(ref, ref * 1.01)
    assert pooled["pooled"] and 0.999 < pooled["value"] < 1.0
    assert cosine_score(ref, ref)["value"] == pytest.approx(1.0, abs=1e-6)
    assert cosine_score(ref, 1.0 - ref)["value"] == pytest.approx(-1.0, abs=1e-6)  # follows it backwards


def test_a_short_output_that_ignores_its_input_fails_pooled_however_close_its_values_sit() -> None:
    # a score per sample near -0.1 (a shared offset): a plain cosine of a constant -0.13 with it is 0.99+
    ref = np.linspace(-0.116, -0.085, 24).reshape(24, 1)
    constant = np.full_like(ref, -0.1306)
    assert float(ref.ravel() @ constant.ravel() / np.linalg.norm(ref) / np.linalg.norm(constant)) > 0.99
    assert cosine_score(ref, constant)["value"] == pytest.approx(0.0, abs=1e-9)  # the held-out judge
    cases = [("calib-heldout", i, {"out": {"score": ref[i : i + 1]}}) for i in range(24)]
    for cand, passes in ((constant, False), (ref + 1e-4, True)):
        rows = judge_goldens(cases, [{"score": cand[i : i + 1]} for i in range(24)], "int8", {"min_cosine": 0.99})
        pooled = [r for r in rows if r.get("check") == "pooled_cosine"]
        assert len(pooled) == 1 and pooled[0]["passed"] is passes and pooled[0]["rows"] == 24
        per_golden = [r for r in rows if r.get("sample") is not None]
        assert all(r["passed"] for r in per_golden)  # per golden: cosine n/a
        assert any(r.get("check") == "input_dependence" for r in rows) is not passes  # the constant ignores input
        if not passes:
            assert re.match(r"cosine: -?0\.000000 < 0\.99 \(about the reference's mean", pooled[0]["reason"])


class _Runner:
    """A candidate given as arrays (the device check's runner interface)."""

    def __init__(self, outputs: list[dict[str, np.ndarray]]) -> None:
        self.outputs = iter(outputs)

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return next(self.outputs)


def test_the_bundle_dry_run_applies_the_same_judge() -> None:
    cases, got = _cases()
    goldens = {point: {s: dict(pair, **{"in": {}}) for p, s, pair in cases if p == point} for point in ("opt", "data")}
    spec = {"tolerance": INT8, "outputs": ["emb"], "precision": "int8"}
    device_rows = device.validate(_Runner([got[1], got[0]]), goldens, spec)  # sorted points: data, opt
    host_rows = judge_goldens(cases, got, "int8", INT8, outputs=["emb"])
    assert [r["passed"] for r in device_rows] == [True, True] == [r["passed"] for r in host_rows]
    assert {r["shape"]: r.get("informational") for r in device_rows} == {
        r["shape"]: r.get("informational") for r in host_rows
    }


def _build(cfg: Path, calib: Path, out: Path, *extra: str) -> int:
    argv = ["build", "--config", str(cfg), "--out", str(out), "--precision", "int8", "--calib", str(calib)]
    return main([*argv, "--target", "cpu", *extra])


def test_a_speed_probe_preferring_float_never_leaves_a_float_model_labelled_int8(
    tiny_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _normalized_project(tiny_project)
    # the Gemm pinned float: the conv is the one INT8 compute node left, and it comes first in the graph
    cfg.write_text(cfg.read_text().replace("[validate]", '[precision]\nkeep_fp32 = ["/fc/Gemm"]\n\n[validate]'))
    calib = photo_folder(tmp_path / "photos", count=12, size=40)
    # float faster the more of it there is: every prefix "wins"
    monkeypatch.setattr(speed_probe, "interleaved_p50", _timings({0: 10.0, 1: 5.0, 2: 1.0, 3: 0.5}))
    assert _build(cfg, calib, tmp_path / "cpu") == 0
    plan = json.loads((tmp_path / "cpu" / "precision.json").read_text())
    probe = plan["float_when_faster"]
    assert probe["status"] == "skipped" and "would leave no INT8 compute" in probe["why"] and not probe["kept"]
    assert analysis.int8_compute_ops(tmp_path / "cpu" / "model.int8.onnx") == ["/conv/Conv"]
    report = json.loads((tmp_path / "cpu" / "report.json").read_text())
    assert report["precision"] == "int8" and report["status"] == "passed"


def test_int8_with_every_compute_node_float_is_refused_not_shipped(
    tiny_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _normalized_project(tiny_project)
    text = cfg.read_text().replace("[validate]", '[precision]\nkeep_fp32 = ["/conv/Conv", "/fc/Gemm"]\n\n[validate]')
    cfg.write_text(text)
    calib = photo_folder(tmp_path / "photos", count=12, size=40)
    assert _build(cfg, calib, tmp_path / "cpu") == 6
    err = capsys.readouterr().err
    assert "no INT8 compute" in err and "2 listed in precision.keep_fp32" in err
    assert "list fewer nodes in precision.keep_fp32" in err and "accuracy_target" not in err
    assert not (tmp_path / "cpu" / "model.int8.onnx").exists()


def test_int8_not_faster_than_fp32_says_so_once_and_in_the_report(
    tiny_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _normalized_project(tiny_project)
    calib = photo_folder(tmp_path / "photos", count=12, size=40)
    real = analysis.measure_latency

    def scripted(path: Path, feeds: dict[str, np.ndarray], *, warmup: int, iters: int, **kw: Any) -> dict[str, Any]:
        row = real(path, feeds, warmup=warmup, iters=1, **kw)  # the model really runs; only the clock is scripted
        return {**row, "p50_ms": 5.0 if "int8" in Path(path).name else 4.0}

    monkeypatch.setattr(analysis, "measure_latency", scripted)
    assert _build(cfg, calib, tmp_path / "cpu", "--float-when-faster", "false") == 0
    report = json.loads((tmp_path / "cpu" / "report.json").read_text())
    assert report["metrics"]["precision"]["speedup_vs_fp32"] == pytest.approx(0.8)
    lines = [w for w in report["warnings"] if "INT8 is not faster than FP32" in w]
    assert len(lines) == 1 and "speedup_vs_fp32 0.80" in lines[0]
    assert capsys.readouterr().out.count("INT8 is not faster than FP32") + 0 <= 1
    assert "speedup_vs_fp32" not in (tmp_path / "cpu" / "precision.json").read_text()  # hashed: no timings


def test_the_release_gate_judges_agreement_where_the_build_did() -> None:
    from edgedeploy.policy import GatePolicy
    from edgedeploy.validate.gate import evaluate

    cases, got = _cases()
    rows = [dict(r, check="parity") for r in judge_goldens(cases, got, "int8", INT8, outputs=["emb"])]
    report = {
        "schema": "edgedeploy-report/1",
        "status": "passed",
        "parity": {
            "status": "passed",
            "candidates": [
                {"name": "onnxruntime-int8", "precision": "int8", "status": "passed", "deploy": True, "checks": rows}
            ],
        },
        "latency": {"status": "skipped", "reason": "not timed"},
    }
    policy = GatePolicy(min_cosine={"int8": 0.99})
    result = evaluate(report, policy)
    # the spec-random row's cosine (~0.7) is informational; the real sample's (~1.0) meets the gate's minimum
    assert result.passed, [c.line() for c in result.failures]
    rows[1]["cosine"] = 0.95  # the real sample below the gate's minimum fails it
    assert evaluate(report, policy).exit_code == 7


def test_int8_candidates_are_vetoed_by_real_samples_only(tmp_path: Path) -> None:
    from test_precision import _stage_ctx, outlier_net

    from edgedeploy.modelio.goldens import golden_key
    from edgedeploy.precision.goldens_veto import golden_cases, goldens_veto

    ctx = _stage_ctx(tmp_path, "jetson-orin", "int8", outlier_net(), {"accuracy_target": 0.5})
    model = ctx.staging / "model.onnx"
    feeds = {"image": np.random.default_rng(0).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)}
    right = analysis.run_model(model, [feeds])[0]["logits"]
    wrong = np.ones((1, 10), np.float32)  # nothing the model produces

    def veto(random_out: np.ndarray, real_out: np.ndarray) -> str | None:
        arrays = {
            golden_key("opt", 0, "in", "image"): feeds["image"],
            golden_key("opt", 0, "out", "logits"): random_out,
            golden_key("data", 0, "in", "image"): feeds["image"],
            golden_key("data", 0, "out", "logits"): real_out,
        }
        np.savez(ctx.staging / "goldens.npz", **arrays)
        return goldens_veto(ctx.cfg, model, golden_cases(ctx.staging / "goldens.npz"))

    assert veto(wrong, right) is None  # a spec-random golden never vetoes when real samples exist
    reason = veto(right, wrong)
    assert reason and reason.startswith("golden real sample data#0 logits fails tolerance.int8: cosine")


def _other_net(tmp_path: Path) -> Path:
    """The same architecture with other weights: its top-1 mostly disagrees with the float model's."""
    import torch

    net = residual_net()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_()
    x = photo_batches(samples=8, batch=8)[0]["image"]
    return export_onnx(net, x, tmp_path / "other.onnx")


def test_a_judge_stops_only_when_the_target_is_out_of_reach(tmp_path: Path) -> None:
    x = photo_batches(samples=8, batch=8)[0]["image"]
    float_model = export_onnx(residual_net(), x, tmp_path / "float.onnx")
    views = photo_batches(samples=64, batch=1)
    groups = [4] * 16  # 16 independent sources of 4 views each
    reference = analysis.run_model(float_model, views)
    # a candidate far off: stopped after the first step, and the whole judge would have failed it too
    other = _other_net(tmp_path)
    score, judged = analysis.accuracy_until_decided(other, views, reference, ["logits"], groups, 0.95)
    full = analysis.accuracy(reference, analysis.run_model(other, views), ["logits"], groups)
    assert judged == 4 * analysis.JUDGED_GROUPS_PER_STEP < len(views)
    assert score["score"] < 0.95 and full["score"] < 0.95
    # a candidate that meets the target is judged on every view: the same accuracy as the whole judge's
    score, judged = analysis.accuracy_until_decided(float_model, views, reference, ["logits"], groups, 0.95)
    assert judged == len(views)
    assert score == analysis.accuracy(reference, analysis.run_model(float_model, views), ["logits"], groups)
    # judged by cosine instead (no classifier output): far off too, stopped as early, failed by the whole judge
    score, judged = analysis.accuracy_until_decided(other, views, reference, [], groups, 0.95)
    full = analysis.accuracy(reference, analysis.run_model(other, views), [], groups)
    assert judged == 4 * analysis.JUDGED_GROUPS_PER_STEP and score["metric"] == full["metric"] == "cosine"
    assert score["score"] < 0.95 and full["score"] < 0.95


def test_a_try_stopped_early_says_on_how_many_samples() -> None:
    row = {"try": 1, "float_nodes": 4, "metric": "top1_agreement", "score": 0.81, "judged_samples": 96, "samples": 512}
    assert analysis.stopped_early(row) == " on 96 of 512 samples (the rest cannot lift it to the target)"
    assert analysis.stopped_early({"score": 0.97}) == ""


def test_shared_inputs_pairs_batches_with_equal_inputs_only() -> None:
    """The goldens' real samples among the judged views are found by value: equal arrays pair, an array that
    differs in one value, in dtype or in shape does not."""
    from edgedeploy.precision import analysis

    rng = np.random.default_rng(3)
    judged = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(6)]
    near = judged[4]["x"].copy()
    near.flat[1] += 1.0  # outside the strided sample the lookup keys on: only the full comparison tells
    goldens = [
        {"x": judged[2]["x"].copy()},
        {"x": near},
        {"x": judged[5]["x"].astype(np.float64)},
        {"x": judged[0]["x"][:, :2].copy()},
        {"x": judged[0]["x"].copy()},
    ]
    assert analysis.shared_inputs(goldens, judged) == {0: 2, 4: 0}


def test_the_gates_top1_minimum_applies_to_the_pooled_agreement_as_the_build_judges_it() -> None:
    from edgedeploy.policy import GatePolicy
    from edgedeploy.validate.gate import evaluate

    def report(pooled: float) -> dict:
        rows = [
            {"check": "parity", "shape": "calib-heldout", "sample": i, "output": "logits", "passed": True,
             "top1_agreement": 0.0 if i == 0 else 1.0, "agreement_judged": True}
            for i in range(16)
        ]  # fmt: skip
        rows.append({"check": "top1_agreement", "shape": "real", "sample": None, "output": "logits", "passed": True,
                     "top1_agreement": pooled})  # fmt: skip
        cand = {"name": "onnxruntime-int8", "precision": "int8", "status": "passed", "deploy": True, "checks": rows}
        return {
            "schema": "edgedeploy-report/1", "status": "passed",
            "parity": {"status": "passed", "candidates": [cand]}, "latency": {"status": "skipped", "reason": "-"},
        }  # fmt: skip

    policy = GatePolicy(min_top1_agreement={"int8": 0.9})
    assert evaluate(report(15 / 16), policy).passed  # one golden of batch 1 disagrees: 15 of 16 pooled
    failed = evaluate(report(0.5), policy)
    assert not failed.passed and any("top-1 agreement 0.5000 < gate minimum 0.9" in c.message for c in failed.failures)


def test_a_candidate_that_barely_follows_its_input_fails_where_a_cosine_per_sample_passes() -> None:
    # probabilities near 0.87 over 5 time steps: a constant candidate has a cosine of 0.9999+ with each sample
    rng = np.random.default_rng(0)
    ref = [0.87 + 0.014 * rng.normal(size=(1, 1, 5)) for _ in range(12)]
    cases = [("calib-heldout", i, {"out": {"p": r}}) for i, r in enumerate(ref)]
    for cand, fails in (([np.full((1, 1, 5), 0.8747)] * 12, True), ([r + 1e-4 for r in ref], False)):
        rows = judge_goldens(cases, [{"p": c} for c in cand], "int8", {"min_cosine": 0.99})
        assert all(r["passed"] for r in rows if r.get("sample") is not None)  # each golden's cosine is 0.9999+
        ignored = [r for r in rows if r.get("check") == "input_dependence"]
        assert bool(ignored) is fails
        if fails:
            assert not ignored[0]["passed"] and ignored[0]["reason"].startswith("ignores input: its p varies across 12")


def test_a_lower_target_is_offered_only_from_a_whole_judged_try_that_kept_int8_compute() -> None:
    from types import SimpleNamespace

    from edgedeploy.stages.precision import _int8_fixes

    ctx = SimpleNamespace(cfg=SimpleNamespace(precision=SimpleNamespace(max_fallback_tries=8)))
    tries = [
        {"float_nodes": 0, "score": 0.90, "int8_compute": True},
        {"float_nodes": 4, "score": 0.95, "int8_compute": True, "judged_samples": 64},  # stopped early: an estimate
        {"float_nodes": 9, "score": 0.98, "int8_compute": False},  # every compute node float: FP32 by another name
    ]
    fixes = _int8_fixes(ctx, tries, 0.999, more_tries=False)
    assert "lower precision.accuracy_target to 0.9 " in fixes  # the only try that could ship INT8 at that target
    assert "0.95" not in fixes and "0.98" not in fixes
    fixes = _int8_fixes(ctx, tries[1:], 0.999, more_tries=False)
    assert "accuracy_target" not in fixes and fixes.endswith("build FP32 (or FP16 on a GPU target)")


def test_the_summary_keeps_the_largest_error_of_a_shapes_samples() -> None:
    from edgedeploy.pipeline.report import summarize

    checks = [{"shape": "calib-heldout", "output": "y", "max_abs": v} for v in (3.5e-3, 5.8e-3, 1.0e-3)]
    summary = summarize({"parity": {"status": "passed", "candidates": [{"name": "ort", "checks": checks}]}})
    assert summary["max_abs_error"] == {"ort@calib-heldout:y": 5.8e-3}


def test_integer_outputs_are_judged_by_exact_agreement_not_by_cosine_or_distance() -> None:
    """Class ids (an argmax output) are decisions: id 7 instead of 6 is as wrong as 0 instead of 6. A cosine of
    ids passes nearly anything (0.99 here for 4 of 16 ids changed), so integer values are compared exactly: per
    golden under FP32's rule (every value equal), pooled like top-1 under a reduced precision's minimum."""
    ids = np.arange(16, dtype=np.int64) % 9 + 3
    moved = ids.copy()
    moved[:4] += 1  # four neighbours' ids
    assert float(ids @ moved / np.linalg.norm(ids) / np.linalg.norm(moved)) > 0.99
    row = compare_output(ids, moved, min_cosine=0.98)
    assert row["cosine"] is None and row["cosine_na"].startswith("n/a: integer output")
    assert row["top1_agreement"] == 0.75 and row["top1_rows"] == 16 and not row["passed"]
    assert "4 of 16 integer values differ, compared exactly (first at flat index 0: ref 3, got 4)" in row["reason"]
    assert compare_output(ids, ids.copy(), min_cosine=0.98)["passed"]
    fp32 = {"atol": 1e-4, "rtol": 1e-3, "min_cosine": 0.9999, "min_topk_agreement": None}
    cases = [("calib-heldout", i, {"out": {"cls": ids[i : i + 1]}}) for i in range(16)]
    got = [{"cls": moved[i : i + 1]} for i in range(16)]
    rows = judge_goldens(cases, got, "fp32", fp32)
    assert sum(not r["passed"] for r in rows) == 4 and all(r.get("check") != "pooled_cosine" for r in rows)
    # INT8: one pooled exact-agreement row against min_topk_agreement, as a classifier's top-1 (12 of 16: fails)
    rows = judge_goldens(cases, got, "int8", INT8)
    pooled = [r for r in rows if r.get("check") == "top1_agreement"]
    assert len(pooled) == 1 and pooled[0]["integer"] and not pooled[0]["passed"] and pooled[0]["rows"] == 16
    assert "exact agreement 0.7500 (12 of 16 integer values of real samples" in pooled[0]["reason"]
    assert all(r["passed"] for r in rows if r.get("sample") is not None)  # per golden: pooled instead
    closer = [{"cls": (moved if i == 0 else ids)[i : i + 1]} for i in range(16)]
    assert all(r["passed"] for r in judge_goldens(cases, closer, "int8", {**INT8, "min_topk_agreement": 0.9}))
    # the precision stage's judge: the share of equal values is the score, whatever the classifier list says
    score = analysis.accuracy([{"cls": ids}], [{"cls": moved}], classifier_outputs=[])
    assert score["metric"] == "top1_agreement" and score["score"] == 0.75
    from edgedeploy.precision.heldout import held_out_score

    assert held_out_score([{"cls": ids}], [{"cls": moved}])["outputs"]["cls"]["value"] == 0.75


def test_the_gate_refuses_a_row_that_excuses_itself_from_agreement_where_the_build_would_judge_it() -> None:
    """A spec-random golden of an INT8 artifact is not judged for agreement; a real-sample golden, or any golden
    of an FP32 artifact, is. A row marked not judged there (an edited report or device result) fails the gate."""
    from edgedeploy.policy import GatePolicy
    from edgedeploy.validate.gate import evaluate

    def report(precision: str, point: str) -> dict:
        rows = [
            {"check": "parity", "shape": "calib-heldout", "sample": 0, "output": "y", "passed": True,
             "cosine": 0.9999, "agreement_judged": True},
            {"check": "parity", "shape": point, "sample": 1, "output": "y", "passed": True, "cosine": 0.12,
             "agreement_judged": False},
        ]  # fmt: skip
        cand = {"name": "onnxruntime-x", "precision": precision, "status": "passed", "deploy": True, "checks": rows}
        return {
            "schema": "edgedeploy-report/1", "status": "passed",
            "parity": {"status": "passed", "candidates": [cand]}, "latency": {"status": "skipped", "reason": "-"},
        }  # fmt: skip

    policy = GatePolicy(min_cosine={"int8": 0.98, "fp32": 0.9999})
    assert evaluate(report("int8", "opt"), policy).passed  # spec-random golden of INT8: informational
    for precision, point in (("fp32", "opt"), ("int8", "data")):
        failed = evaluate(report(precision, point), policy)
        assert not failed.passed, (precision, point)
        assert any("marked not judged for agreement" in c.message for c in failed.failures)


def test_a_one_value_output_is_judged_per_sample_pooled_whatever_the_batch_size() -> None:
    """A temperature near 300 K per sample, in goldens of batch 4: a cosine over a golden's 4 values is 0.99999+
    for any values near 300 (their shared offset), so FP16's 0.25 K steps that erase the signal passed. Under 3
    values per sample the output is judged by the pooled centred cosine at every batch size."""
    rng = np.random.default_rng(0)
    fp16 = {"atol": 1e-2, "rtol": 1e-2, "min_cosine": 0.999, "min_topk_agreement": None}
    for batch in (1, 4):
        ref = (300.0 + rng.normal(0, 0.09, (16, batch, 1))).astype(np.float32)
        stepped = np.round(ref * 4) / 4  # FP16's spacing near 300
        cases = [("calib-heldout", i, {"out": {"temp": ref[i]}}) for i in range(16)]
        rows = judge_goldens(cases, [{"temp": stepped[i]} for i in range(16)], "fp16", fp16)
        pooled = [r for r in rows if r.get("check") == "pooled_cosine"]
        assert len(pooled) == 1 and not pooled[0]["passed"] and pooled[0]["rows"] == 16, batch
        per_golden = [r for r in rows if r.get("sample") is not None]
        assert all(r["cosine"] is None and "value(s) per sample" in r["cosine_na"] for r in per_golden)
        close = [{"temp": ref[i] + np.float32(1e-4)} for i in range(16)]
        assert all(r["passed"] for r in judge_goldens(cases, close, "fp16", fp16))


def test_a_top1_minimum_with_no_top1_row_to_apply_to_fails_the_gate_not_passes_it() -> None:
    from edgedeploy.policy import GatePolicy
    from edgedeploy.validate.gate import evaluate

    rows = [{"check": "parity", "shape": "calib-heldout", "sample": 0, "output": "y", "passed": True, "cosine": 1.0}]
    cand = {"name": "onnxruntime-int8", "precision": "int8", "status": "passed", "deploy": True, "checks": rows}
    report = {
        "schema": "edgedeploy-report/1", "status": "passed",
        "parity": {"status": "passed", "candidates": [cand]}, "latency": {"status": "skipped", "reason": "-"},
    }  # fmt: skip
    assert evaluate(report, GatePolicy()).passed
    failed = evaluate(report, GatePolicy(min_top1_agreement={"int8": 0.99}))
    assert not failed.passed
    assert any("has no top-1 row of onnxruntime-int8 to apply to" in c.message for c in failed.failures)
    assert any("names no validate.classifier_outputs" in c.message for c in failed.failures)
    assert evaluate(report, GatePolicy(min_top1_agreement={"fp16": 0.99})).passed  # another precision's minimum
    rows[0]["top1_agreement"] = 1.0  # a classifier output, judged per golden, with no pooled top-1 minimum set
    failed = evaluate(report, GatePolicy(min_top1_agreement={"int8": 0.99}))
    assert any("set tolerance.int8.min_topk_agreement and rebuild" in c.message for c in failed.failures)


def test_the_least_standard_error_is_never_above_the_one_any_other_groups_give() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        groups = int(rng.integers(2, 20))
        judged = rng.uniform(0.6, 1.0, int(rng.integers(0, groups + 1))).tolist()
        least = analysis.least_standard_error(judged, groups)
        rest = rng.uniform(0.0, 1.0, groups - len(judged))
        full = np.r_[judged, rest]
        assert least <= np.std(full, ddof=1) / np.sqrt(groups) + 1e-12
        if len(judged) >= 2:  # the others at the judged ones' mean: that standard error exactly
            same = np.r_[judged, np.full(groups - len(judged), np.mean(judged))]
            assert np.isclose(least, np.std(same, ddof=1) / np.sqrt(groups))


def _identity_model(path: Path) -> Path:
    """A model whose logits are its input: its outputs are exactly the arrays fed to it."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["logits"])],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_near_miss_that_only_the_standard_error_fails_stops_early(tmp_path: Path) -> None:
    """Top-1 counted on 95.3 % of the views, above the 0.95 target, but six of the 16 sources move every lead
    a long way (expected agreement 0.86 there, 1.0 elsewhere): the standard error over the sources fails it.
    Once the judged sources alone fix that much spread the rest cannot lift it, and the judging stops."""
    model = _identity_model(tmp_path / "identity.onnx")
    ref = np.tile(np.array([[1.0, 0.0]], np.float32), (128, 1))  # every view leads by 1.0
    cand = ref.copy()
    for g in range(6):  # the first six sources: seven leads shrunk to 0.1, one flipped
        cand[g * 8 : g * 8 + 7, 0] = 0.1
        cand[g * 8 + 7, 0] = -0.1
    views = [{"x": cand[i : i + 1]} for i in range(128)]
    reference = [{"logits": ref[i : i + 1]} for i in range(128)]
    groups = [8] * 16
    full = analysis.accuracy(reference, [{"logits": v["x"]} for v in views], ["logits"], groups)
    row = full["outputs"]["logits"]
    assert row["observed"] > 0.95 > full["score"]  # failed by the standard error alone
    score, judged = analysis.accuracy_until_decided(model, views, reference, ["logits"], groups, 0.95)
    assert judged < len(views)  # the counted agreement alone never rules it out (it stays above 0.95)
    assert score["score"] < 0.95
    # the same views with every lead kept: it passes, judged on every view
    same = [{"x": ref[i : i + 1]} for i in range(128)]
    score, judged = analysis.accuracy_until_decided(model, same, reference, ["logits"], groups, 0.95)
    assert judged == len(views) and score["score"] >= 0.95


def test_the_cosine_bound_is_the_best_any_rest_of_the_batches_can_give() -> None:
    """After some batches, no values for the others give a cosine (compare_output's: one over every value)
    above the bound, and the rest lined up with the reference, scaled right, gives exactly it."""
    rng = np.random.default_rng(3)
    for trial in range(20):
        ref = rng.standard_normal((6, 10))
        seen = int(rng.integers(1, 6))
        judged = ref[:seen] + rng.normal(0.0, [0.05, 1.0, 3.0][trial % 3], (seen, 10))
        if trial % 5 == 0:
            judged = -judged  # a judged part pointing away from the reference
        bound = analysis.CosineBound([{"y": r[None]} for r in ref], "y")
        assert bound.bounds
        best = bound.add([{"y": r[None]} for r in ref[:seen]], [j[None] for j in judged])

        def cosine(rest: np.ndarray, ref: np.ndarray = ref, judged: np.ndarray = judged) -> float:
            return float(compare_output(ref, np.r_[judged, rest])["cosine"])

        for _ in range(50):  # any rest: never above the bound
            assert cosine(rng.standard_normal((6 - seen, 10)) * rng.uniform(0.01, 10.0)) <= best + 1e-12
        # the rest along the reference, scaled by |judged| / a (a: their dot product over |judged|): the bound
        # itself; where a <= 0 the bound is the limit of ever larger scales
        a = float((ref[:seen] * judged).sum()) / float(np.linalg.norm(judged))
        scale = float(np.linalg.norm(judged)) / a if a > 0 else 1e9
        assert cosine(scale * ref[seen:]) == pytest.approx(best, abs=1e-9 if a > 0 else 1e-6)
        if a > 0:  # a maximum: either side of that scale gives less
            assert max(cosine(scale * ref[seen:] * 1.1), cosine(scale * ref[seen:] / 1.1)) < best


def test_a_cosine_judge_stops_only_where_the_rest_cannot_lift_it(tmp_path: Path) -> None:
    """Ungrouped batches are judged in JUDGED_STEPS steps. A candidate off in its first batches stops early and the
    whole judge fails it too; one off only in the last step's batches, or a passing one, is judged on every batch."""
    model = _identity_model(tmp_path / "identity.onnx")
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((64, 2)).astype(np.float32) + np.float32(3.0)
    bad = ref.copy()
    bad[:16] = -bad[:16]  # the first quarter points the other way
    reference = [{"logits": ref[i : i + 1]} for i in range(64)]

    def judge(cand: np.ndarray, target: float) -> tuple[dict[str, Any], int, dict[str, Any]]:
        views = [{"x": cand[i : i + 1]} for i in range(64)]
        score, judged = analysis.accuracy_until_decided(model, views, reference, [], None, target)
        return score, judged, analysis.accuracy(reference, [{"logits": v["x"]} for v in views], [])

    score, judged, full = judge(bad, 0.9)
    assert full["score"] < 0.9 and score["score"] < 0.9 and score["metric"] == "cosine"
    assert judged < 64 and judged % (64 // analysis.JUDGED_STEPS) == 0
    late = np.r_[ref[:56], bad[:8]]  # a miss in the last step's batches alone: seen only at the end
    score, judged, full = judge(late, 0.9)
    assert judged == 64 and score == full and full["score"] < 0.9
    close = _noisy(ref, 0.05)
    score, judged, full = judge(close, 0.99)
    assert judged == 64 and score == full and full["score"] >= 0.99


def test_a_non_finite_output_stops_the_judge_at_once(tmp_path: Path) -> None:
    model = _identity_model(tmp_path / "identity.onnx")
    ref = np.ones((64, 2), np.float32)
    cand = ref.copy()
    cand[3, 1] = np.nan
    reference = [{"logits": ref[i : i + 1]} for i in range(64)]
    views = [{"x": cand[i : i + 1]} for i in range(64)]
    score, judged = analysis.accuracy_until_decided(model, views, reference, [], None, 0.9)
    assert judged == 64 // analysis.JUDGED_STEPS and score["score"] == 0.0


def test_a_stop_never_reports_a_score_the_judged_batches_alone_would_pass(tmp_path: Path) -> None:
    """Two values a batch: after the first batch the bound rules the target out, but one batch's two values are
    too few for a cosine (scored 1.0, as compare_output scores it). Judging goes on rather than report a passing
    score for a stopped try; the verdict is the whole judge's."""
    model = _identity_model(tmp_path / "identity.onnx")
    ref = np.tile(np.array([[1.0, 2.0]], np.float32), (8, 1))
    cand = ref.copy()
    cand[0] = -cand[0]
    reference = [{"logits": ref[i : i + 1]} for i in range(8)]
    views = [{"x": cand[i : i + 1]} for i in range(8)]
    assert analysis.accuracy(reference[:1], [{"logits": cand[:1]}], [])["score"] == 1.0  # one batch: no cosine
    score, judged = analysis.accuracy_until_decided(model, views, reference, [], None, 0.95)
    full = analysis.accuracy(reference, [{"logits": v["x"]} for v in views], [])
    assert score["score"] < 0.95 and full["score"] < 0.95 and judged > 1


def _identity_run(batches: Any) -> list[dict[str, np.ndarray]]:
    """A candidate whose output is its input, as a held-out runner over a list of batches."""
    return [{"y": b["x"]} for b in batches]


@pytest.mark.parametrize("kind", ["cosine", "top1", "equal"])
def test_the_reachable_held_out_score_is_every_sample_left_agreeing(kind: str) -> None:
    """After any number of batches, the bound is the score of the rest agreeing exactly (top-1: the observed
    share, which the score never exceeds), and no rest scores above it."""
    from edgedeploy.precision.heldout import ReachableScore, held_out_score

    rng = np.random.default_rng(7)
    ref = rng.standard_normal((16, 4, 6)).astype(np.float32)
    if kind == "equal":
        ref = rng.integers(0, 5, (16, 4, 6)).astype(np.int64)
    cand = ref + rng.normal(0.0, 0.8, ref.shape) if kind != "equal" else np.where(rng.random(ref.shape) < 0.3, 9, ref)
    classes = ["y"] if kind == "top1" else []

    def batched(values: np.ndarray) -> list[dict[str, np.ndarray]]:  # two samples a batch
        return [{"y": values[i : i + 2].astype(ref.dtype)} for i in range(0, 16, 2)]

    reference = batched(ref)
    for seen in range(1, 8):
        bound = ReachableScore(reference, "y", classes)
        best = bound.add(reference[:seen], batched(cand)[:seen])
        exact_rest = batched(np.r_[cand[: 2 * seen], ref[2 * seen :]])
        row = held_out_score(reference, exact_rest, classes)["outputs"]["y"]
        assert best == pytest.approx(row.get("observed", row["value"]), abs=1e-12)
        for _ in range(5):
            shape = ref[2 * seen :].shape
            rest = rng.standard_normal(shape) if kind != "equal" else rng.integers(0, 5, shape)
            other = batched(np.r_[cand[: 2 * seen], rest])
            assert held_out_score(reference, other, classes)["score"] <= best + 1e-12


def test_a_held_out_judge_stops_only_where_the_rest_cannot_lift_it() -> None:
    from edgedeploy.precision.heldout import JUDGED_STEPS, held_out_score, held_out_until_decided

    rng = np.random.default_rng(0)
    ref = rng.standard_normal((64, 8)).astype(np.float32)
    reference = [{"y": r[None]} for r in ref]

    def judge(cand: np.ndarray, target: float) -> tuple[dict[str, Any], int, dict[str, Any]]:
        views = [{"x": c[None]} for c in cand]
        score, judged, outputs = held_out_until_decided(_identity_run, reference, views, [], target)
        assert len(outputs) == judged
        return score, judged, held_out_score(reference, _identity_run(views))

    far = np.r_[-ref[:16], ref[16:]]  # the first quarter points the other way: cosine 0.5 over all
    score, judged, full = judge(far, 0.9)
    assert judged == 64 // JUDGED_STEPS and score["score"] < 0.9 and full["score"] < 0.9
    late = np.r_[ref[:56], -ref[56:]]  # the miss in the last step's batches alone
    score, judged, full = judge(late, 0.9)
    assert judged == 64 and score == full and full["score"] < 0.9
    close = _noisy(ref, 0.01)
    score, judged, full = judge(close, 0.99)
    assert judged == 64 and score == full and full["score"] >= 0.99
    # a non-finite value scores 0 whatever the rest shows: stopped at the first step
    broken = close.copy()
    broken[2, 3] = np.inf
    score, judged, _ = judge(broken, 0.99)
    assert judged == 64 // JUDGED_STEPS and score["score"] == 0.0
    # one value a sample: one pooled cosine, not bounded, judged whole
    pooled = [{"y": r[None, :1]} for r in ref]
    cand = [{"x": -r[None, :1]} for r in ref]
    score, judged, _ = held_out_until_decided(_identity_run, pooled, cand, [], 0.9)
    assert judged == 64 and score["score"] < 0.9


def test_a_top1_judge_without_groups_stops_where_the_disagreements_rule_the_target_out(tmp_path: Path) -> None:
    """No independent groups (validate.data, not photos): judged in JUDGED_STEPS steps, stopped once the top-1
    disagreements so far keep the agreement over every batch below the target; a passing one judged on all."""
    model = _identity_model(tmp_path / "identity.onnx")
    ref = np.tile(np.array([[1.0, 0.0]], np.float32), (64, 1))
    flipped = ref.copy()
    flipped[:8] = ref[:8, ::-1]  # the first step's 8 rows disagree: at most 56 of 64 agree, under 0.95
    reference = [{"logits": ref[i : i + 1]} for i in range(64)]
    views = [{"x": flipped[i : i + 1]} for i in range(64)]
    score, judged = analysis.accuracy_until_decided(model, views, reference, ["logits"], None, 0.95)
    assert judged == 64 // analysis.JUDGED_STEPS and score["score"] == 0.0
    same = [{"x": ref[i : i + 1]} for i in range(64)]
    score, judged = analysis.accuracy_until_decided(model, same, reference, ["logits"], None, 0.95)
    assert judged == 64 and score["score"] == 1.0
