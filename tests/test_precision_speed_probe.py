"""precision.float_when_faster: early layers kept float where they measure faster than INT8 (speed_probe.py)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from test_calib_data import photo_folder
from test_precision import photo_batches
from test_precision_build import _normalized_project
from test_precision_equalize import _model

from edgedeploy.cli import main
from edgedeploy.precision import speed_probe
from edgedeploy.precision.analysis import quantized_nodes
from edgedeploy.precision.quantize import Quantizer, flavour_for


def _timings(p50_by_prefix: dict[int, float]):
    """An ``interleaved_p50`` that reports fixed per-round times: prefix k -> ms (the models are still built,
    quantized and run by the probe; only the clock is scripted, so the decision rule is what is tested)."""

    def fake(runs, *, rounds, iters, warmup=2):
        for run in runs.values():
            run()  # the sessions really run
        return {name: [p50_by_prefix[int(name)]] * rounds for name in runs}

    return fake


def _quantizer(tmp_path: Path) -> Quantizer:
    (tmp_path / "q").mkdir()
    return Quantizer(_model(tmp_path), tmp_path / "q", flavour_for("onnxruntime"), reduce_range=False)


def test_the_fastest_float_prefix_is_kept_with_its_measured_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = _quantizer(tmp_path)
    batches = photo_batches(samples=8, batch=4)
    monkeypatch.setattr(speed_probe, "interleaved_p50", _timings({0: 10.0, 1: 8.0, 2: 9.0, 3: 9.5}))
    probe = speed_probe.probe_float_prefix(q, batches, batches[0])
    order = quantized_nodes(onnx.load(str(q.workdir / "speed0.int8.onnx")))
    assert probe.status == "measured" and list(probe.kept) == order[:1]
    # three convs: a prefix of all three would leave no INT8 compute, so the longest timed prefix is two
    assert [row["float_nodes"] for row in probe.measured] == [0, 1, 2]
    assert probe.measured[1]["latency_ratio_vs_all_int8"] == pytest.approx(1.25)
    assert probe.measured[1]["p50_ms"] == pytest.approx(8.0)
    assert probe.kept[order[0]].startswith("faster in float on this CPU: the first 1 quantized node(s)")
    # each timed model really has its prefix in float: the first node reads no DequantizeLinear
    assert order[0] not in quantized_nodes(onnx.load(str(q.workdir / "speed1.int8.onnx")))
    assert order[1] in quantized_nodes(onnx.load(str(q.workdir / "speed1.int8.onnx")))


def test_nothing_is_kept_float_when_no_prefix_beats_all_int8_by_the_margin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = _quantizer(tmp_path)
    batches = photo_batches(samples=8, batch=4)
    monkeypatch.setattr(speed_probe, "interleaved_p50", _timings({0: 10.0, 1: 9.8, 2: 10.5, 3: 12.0}))
    probe = speed_probe.probe_float_prefix(q, batches, batches[0])
    assert probe.status == "measured" and probe.kept == {}
    assert "faster than all-INT8" in probe.why


def test_a_model_faster_than_a_millisecond_is_not_probed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q = _quantizer(tmp_path)
    batches = photo_batches(samples=8, batch=4)
    monkeypatch.setattr(speed_probe, "interleaved_p50", _timings({0: 0.4, 1: 0.1, 2: 0.1, 3: 0.1}))
    probe = speed_probe.probe_float_prefix(q, batches, batches[0])
    assert probe.status == "skipped" and probe.kept == {} and "under 1 ms" in probe.why
    assert probe.measured == [{"float_nodes": 0, "nodes": [], "p50_ms": 0.4}]
    assert not (q.workdir / "speed1.int8.onnx").exists()  # nothing more was quantized


def test_pinned_nodes_stay_float_and_the_prefix_starts_after_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = _quantizer(tmp_path)
    batches = photo_batches(samples=8, batch=4)
    first = quantized_nodes(onnx.load(str(q.quantize(tmp_path / "all.int8.onnx", batches))))
    monkeypatch.setattr(speed_probe, "interleaved_p50", _timings({0: 10.0, 1: 5.0, 2: 9.0, 3: 9.0}))
    probe = speed_probe.probe_float_prefix(q, batches, batches[0], pinned=[first[0]])
    assert list(probe.kept) == [first[1]]
    assert len(probe.measured) == 2  # two convs left: a two-node prefix would leave no INT8 compute
    for k in range(2):
        assert first[0] not in quantized_nodes(onnx.load(str(q.workdir / f"speed{k}.int8.onnx")))


def test_models_are_timed_in_turns_round_by_round() -> None:
    calls: list[str] = []
    runs = {name: (lambda name=name: calls.append(name)) for name in ("a", "b")}
    per_round = speed_probe.interleaved_p50(runs, rounds=3, iters=2, warmup=1)
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] * 3
    assert {k: len(v) for k, v in per_round.items()} == {"a": 3, "b": 3}


def _build(cfg: Path, calib: Path, out: Path, *extra: str) -> dict:
    argv = ["build", "--config", str(cfg), "--out", str(out), "--precision", "int8", "--calib", str(calib)]
    assert main([*argv, *extra]) == 0
    return json.loads((out / "precision.json").read_text())


def test_stage_keeps_the_faster_prefix_float_and_says_why(
    tiny_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _normalized_project(tiny_project)
    calib = photo_folder(tmp_path / "photos", count=12, size=40)
    monkeypatch.setattr(speed_probe, "interleaved_p50", _timings({0: 10.0, 1: 6.0, 2: 7.0, 3: 8.0}))
    plan = _build(cfg, calib, tmp_path / "cpu", "--target", "cpu")
    probe = plan["float_when_faster"]
    assert probe["status"] == "measured" and len(probe["kept"]) == 1
    kept = {row["node"]: row["why"] for row in plan["kept_float"]}
    assert kept[probe["kept"][0]].startswith("faster in float on this CPU")
    assert "p50_ms" not in json.dumps(plan)  # precision.json is hashed into the bundle: no timings in it
    report = json.loads((tmp_path / "cpu" / "report.json").read_text())
    assert report["metrics"]["precision"]["float_when_faster"]["measured"][1]["p50_ms"] == 6.0
    assert any("1 node(s) kept in float because faster on this CPU" in w for w in report["warnings"])
    assert not any("for accuracy" in w for w in report["warnings"])
    shipped = onnx.load(str(tmp_path / "cpu" / "model.int8.onnx"))
    assert probe["kept"][0] not in quantized_nodes(shipped) and quantized_nodes(shipped)
    # the key turns it off; a TensorRT target's kernels are not this CPU's: nothing is timed there
    off = _build(cfg, calib, tmp_path / "off", "--target", "cpu", "--float-when-faster", "false")
    assert off["float_when_faster"] == {
        "status": "skipped", "why": "precision.float_when_faster = false", "kept": [], "measured": []
    }  # fmt: skip
    assert not any(row["why"].startswith("faster") for row in off["kept_float"])
    trt = _build(cfg, calib, tmp_path / "orin", "--target", "jetson-orin")
    assert trt["float_when_faster"]["status"] == "skipped" and "not this CPU's" in trt["float_when_faster"]["why"]


def test_a_shipped_float_prefix_covering_the_first_nodes_is_not_probed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = _quantizer(tmp_path)
    monkeypatch.setattr(speed_probe, "interleaved_p50", _timings({0: 10.0, 1: 9.9, 2: 9.9, 3: 9.9}))
    batches = photo_batches(samples=8, batch=4)
    order = quantized_nodes(onnx.load(str(q.quantize(tmp_path / "all.int8.onnx", batches))))
    probe = speed_probe.probe_when_set(True, q, batches, order[:3], order, runtime="onnxruntime")
    assert probe.status == "skipped" and probe.kept == {} and probe.measured == []
    assert probe.why.startswith("the accuracy search already keeps the first 3 quantized node(s) float")
    assert not list(q.workdir.glob("speed*.int8.onnx"))  # nothing quantized, nothing timed
    # one of the first nodes still INT8: the probe measures, with the shipped float nodes pinned float
    probe = speed_probe.probe_when_set(True, q, batches, order[:1], order, runtime="onnxruntime")
    assert probe.status == "measured" and probe.kept == {}
    assert order[0] not in quantized_nodes(onnx.load(str(q.workdir / "speed0.int8.onnx")))


def _deep_search(tmp_path: Path, probe_keeps, veto=None):  # type: ignore[no-untyped-def]
    """The prefix-first search on test_precision_fallback's deep outlier net, with a scripted speed probe that
    keeps ``probe_keeps(shipped, order)`` float; what it was asked is returned too."""
    from test_calib_cache import export_onnx
    from test_precision_fallback import _deep_outlier_net

    from edgedeploy.precision.fallback import quantize_with_fallback
    from edgedeploy.precision.quantize import preprocess

    batches = photo_batches(16, 8)
    path = export_onnx(_deep_outlier_net(), batches[0]["image"], tmp_path / "deep.onnx")
    q = Quantizer(preprocess(path, tmp_path / "float.onnx"), tmp_path, flavour_for("onnxruntime"))
    asked: list[tuple[list[str], list[str]]] = []

    def probe(shipped, order):  # type: ignore[no-untyped-def]
        asked.append((list(shipped), list(order)))
        kept = probe_keeps(shipped, order)
        return speed_probe.SpeedProbe("measured", "scripted", kept={n: "faster in float (scripted)" for n in kept})

    result = quantize_with_fallback(
        q, out=tmp_path / "m.int8.onnx", batches=batches, classifier_outputs=[], accuracy_target=0.99, max_tries=8,
        prefix_first=True, speed_probe=probe, extra_check=veto,
    )  # fmt: skip
    return result, asked


def test_the_probe_is_asked_of_the_model_the_search_ships_and_its_faster_model_is_judged(tmp_path: Path) -> None:
    # the node right after the shipped float prefix measured faster in float: one more try, judged, and it ships
    result, asked = _deep_search(tmp_path, lambda shipped, order: [n for n in order if n not in shipped][:1])
    ((shipped, order),) = asked
    searched = [t for t in result.tries if t.get("family") == "prefix" and t["met"]]
    assert set(shipped) == set(min(searched, key=lambda t: t["float_nodes"])["excluded"])
    extra = [n for n in order if n not in shipped][0]
    last = result.tries[-1]
    assert last["family"] == "speed" and last["met"] and set(last["excluded"]) == {*shipped, extra}
    assert result.final is last and result.excluded[extra] == "faster in float (scripted)"
    assert extra not in quantized_nodes(onnx.load(str(tmp_path / "m.int8.onnx")))
    assert result.probe is not None and list(result.probe.kept) == [extra]


def test_a_faster_model_that_misses_the_target_is_not_shipped_and_the_probe_says_so(tmp_path: Path) -> None:
    state = {"probed": False}

    def keeps(shipped, order):  # type: ignore[no-untyped-def]
        state["probed"] = True
        return [n for n in order if n not in shipped][:1]

    result, _ = _deep_search(tmp_path, keeps, veto=lambda model, outputs: "scripted veto" if state["probed"] else None)
    assert result.tries[-1]["family"] == "speed" and not result.tries[-1]["met"]
    assert result.met and result.final["family"] == "prefix" and set(result.final["excluded"]) == set(result.excluded)
    assert result.probe is not None and result.probe.kept == {} and "missed the accuracy target" in result.probe.why
    shipped = quantized_nodes(onnx.load(str(tmp_path / "m.int8.onnx")))
    assert not set(result.excluded) & set(shipped)


def test_a_search_that_meets_no_target_asks_no_probe(tmp_path: Path) -> None:
    result, asked = _deep_search(tmp_path, lambda shipped, order: [], veto=lambda model, outputs: "always vetoed")
    assert not result.met and asked == [] and result.probe is None
