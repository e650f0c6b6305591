"""The fallback search's choice between its two float-set families, and the pooled top-1 rule it is vetoed by."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from test_calib_cache import export_onnx
from test_precision import outlier_net, photo_batches

from edgedeploy.precision import analysis
from edgedeploy.precision.fallback import SPEED_MARGIN, quantize_with_fallback
from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess
from edgedeploy.precision.speed_probe import MIN_MS, side_by_side_timer
from edgedeploy.validate.parity import pooled_top1, top1_upper_bound


def _search(tmp_path: Path, timer, **kwargs) -> tuple:  # type: ignore[no-untyped-def]
    batches = photo_batches(16, 8)
    path = export_onnx(outlier_net(), batches[0]["image"], tmp_path / "outlier.onnx")
    q = Quantizer(preprocess(path, tmp_path / "float.onnx"), tmp_path, flavour_for("onnxruntime"))
    result = quantize_with_fallback(
        q, out=tmp_path / "m.int8.onnx", batches=batches, classifier_outputs=[], accuracy_target=0.99, max_tries=8,
        timer=timer, **kwargs,
    )  # fmt: skip
    return result, q, batches


@pytest.mark.parametrize(
    ("sensitivity_ms", "prefix_ms", "ships"),
    [
        (2.0, 1.0, "prefix"),
        (2.0, 2.0 / (1 + SPEED_MARGIN) + 0.01, "sensitivity"),
        (MIN_MS * 0.9, MIN_MS * 0.1, "sensitivity"),  # both under MIN_MS: timer noise, the first to pass ships
    ],
)
def test_sensitivity_passing_first_searches_the_prefix_on_and_ships_the_faster(
    tmp_path: Path, sensitivity_ms: float, prefix_ms: float, ships: str
) -> None:
    timed: list[list[Path]] = []

    def timer(models):  # type: ignore[no-untyped-def]
        timed.append(list(models))
        return [sensitivity_ms, prefix_ms]  # the sensitivity set's milliseconds, then the prefix's

    result, q, batches = _search(tmp_path, timer)
    passed: dict[str, int] = {}
    for t in result.tries:
        if t["met"]:
            passed[t["family"]] = min(t["float_nodes"], passed.get(t["family"], t["float_nodes"]))
    # the 2 outlier nodes pass first; the prefix family goes on past the size where the search used to stop
    assert passed == {"sensitivity": 2, "prefix": 3}
    # the ranking puts the whole error on the 2 outliers: the search starts there, then bisects down to 1
    assert result.start["predicted"] == 2 and result.start["size"] == 2
    assert [(t.get("family"), t["float_nodes"]) for t in result.tries[1:3]] == [("sensitivity", 2), ("sensitivity", 1)]
    assert not any(t["met"] for t in result.tries if t.get("family") == "prefix" and t["float_nodes"] < 3)
    assert len(timed) == 1 and len(timed[0]) == 2  # both passing sets timed side by side, once
    assert result.met and result.final["family"] == ships and result.choice["family"] == ships
    assert [m["family"] for m in result.choice["measured"]] == ["sensitivity", "prefix"]
    too_short = sensitivity_ms < MIN_MS
    assert ("too short to tell apart" in result.choice["rule"]) is too_short
    assert too_short or result.choice["rule"].startswith("both families passed; the " + ships)
    shipped = analysis.run_model(tmp_path / "m.int8.onnx", batches)
    ref = analysis.run_model(q.float_model, batches)
    assert analysis.accuracy(ref, shipped, [])["score"] >= 0.99
    if ships == "prefix":
        assert set(result.excluded) == {"/c1/Conv", "/Mul", "/c2/Conv"}
        assert all("float prefix" in why for why in result.excluded.values())
    else:
        assert set(result.excluded) == {"/Mul", "/c2/Conv"}


def test_without_a_timer_the_first_family_to_pass_ships_untimed(tmp_path: Path) -> None:
    result, _, _ = _search(tmp_path, None)
    assert result.final["family"] == "sensitivity" and result.choice["rule"] == "first family to pass"
    # started at the ranking's 2, which passed; the bisection's 1 failed; the prefix family never tried
    assert [(t.get("family"), t["float_nodes"]) for t in result.tries] == [
        (None, 0),
        ("sensitivity", 2),
        ("sensitivity", 1),
    ]


def test_the_search_says_why_it_stopped(tmp_path: Path) -> None:
    result, _, _ = _search(tmp_path, None)
    assert result.stop == "smallest passing float set found (sensitivity: 2 float, 1 failed)"


def test_a_spent_time_budget_stops_the_search_before_any_fallback_try_and_says_so(tmp_path: Path) -> None:
    import time

    result, _, _ = _search(tmp_path, None, deadline=time.monotonic())  # already spent
    assert len(result.tries) == 1 and not result.met  # only the all-INT8 candidate, which misses
    assert result.stop == "precision.time_budget_s spent before the fallback search (the first candidate misses " \
        "the target)"  # fmt: skip


def test_side_by_side_timer_times_real_sessions(tmp_path: Path) -> None:
    batches = photo_batches(8, 4)
    path = export_onnx(outlier_net(), batches[0]["image"], tmp_path / "outlier.onnx")
    q = Quantizer(preprocess(path, tmp_path / "float.onnx"), tmp_path, flavour_for("onnxruntime"))
    int8 = q.quantize(tmp_path / "q.onnx", batches)
    ms = side_by_side_timer(batches[0], rounds=2, iters=2)([q.float_model, int8])
    assert len(ms) == 2 and all(np.isfinite(t) and t > 0 for t in ms)


@pytest.mark.parametrize(
    ("agree", "total", "passes"),
    [(90, 96, True), (89, 96, False), (19, 20, True), (18, 20, False), (940, 1000, False), (945, 1000, True)],
)
def test_pooled_top1_fails_only_more_than_one_standard_error_below_the_target(
    agree: int, total: int, passes: bool
) -> None:
    rows = [
        {"shape": "calib-heldout", "output": "logits", "top1_agreement": 1.0 if i < agree else 0.0, "passed": True}
        for i in range(total)
    ]
    (row,) = pooled_top1(rows, 0.95)
    assert row["top1_agreement"] == pytest.approx(agree / total) and row["rows"] == total
    assert row["passed"] is passes
    assert row["top1_upper_bound"] == pytest.approx(top1_upper_bound(agree / total, total))
    assert row["top1_agreement"] <= row["top1_upper_bound"] <= 1.0
    if not passes:
        assert f"{agree} of {total} real samples" in row["reason"] and "within one standard error" in row["reason"]


def test_top1_upper_bound_narrows_with_samples_and_stays_open_at_full_agreement() -> None:
    assert top1_upper_bound(0.9, 20) > top1_upper_bound(0.9, 200) > top1_upper_bound(0.9, 2000) > 0.9
    assert top1_upper_bound(1.0, 10) == 1.0 and top1_upper_bound(0.0, 10) > 0.0
    assert top1_upper_bound(0.5, 0) == 1.0  # nothing counted: nothing to fail


def test_a_prefix_equal_to_a_tried_sensitive_set_reuses_its_result_without_a_new_try() -> None:
    from edgedeploy.precision.fallback import FamilySearch

    made: list[tuple[str, int]] = []

    def attempt(k: int, excl: dict[str, str], family: str = "") -> tuple[bool, Path]:
        made.append((family, k))
        return {"A", "B"} <= set(excl), Path(f"{family}{k}.onnx")  # passes once A and B are both float

    sensitivity = [{"node": n, "op": "Conv", "output_error": e} for n, e in zip("ABCD", (0.4, 0.3, 0.2, 0.1))]
    search = FamilySearch(attempt, {}, sensitivity, ["A", "C", "B", "D"], lambda: len(made) < 10)
    assert search.grow_both() == "sensitivity" and search.passed == {"sensitivity": 2}
    search.grow("prefix")
    search.bisect("prefix")
    # the first prefix ({A}) is the first sensitive set: its failure is reused, never quantized again
    assert made == [("sensitivity", 1), ("sensitivity", 2), ("prefix", 2), ("prefix", 4), ("prefix", 3)]
    assert search.passed == {"sensitivity": 2, "prefix": 3} and search.failed["prefix"] == 2
    family, k, note = search.choose("sensitivity", lambda models: [5.0, 1.0])
    assert (family, k) == ("prefix", 3) and note["measured"][1]["p50_ms"] == 1.0
    assert set(search.float_set(family, k)) == {"A", "C", "B"}


def test_the_ranked_search_starts_where_the_ranking_says_the_miss_is_removed() -> None:
    from edgedeploy.precision.fallback import predicted_first_size

    def ranked(*errors: float) -> list[dict[str, object]]:
        return [{"node": f"n{i}", "op": "Conv", "output_error": e} for i, e in enumerate(errors)]

    spread = ranked(*([0.1] * 40))  # 40 nodes alike: each holds 1/40 of the squared error
    # top-1 0.80 against 0.95: the error must shrink to 1/4, so 1 - 1/16 of it go: 38 nodes, started at 32
    row = {"metric": "top1_agreement", "score": 0.80}
    start = predicted_first_size(spread, row, 0.95)
    assert (start["predicted"], start["size"]) == (38, 32) and "sizes start at 32" in start["why"]
    # a cosine miss shrinks with the error's square: 1 - 1/4 of it go, 30 nodes, started at 16
    cos = predicted_first_size(spread, {"metric": "cosine", "score": 0.80}, 0.95)
    assert (cos["predicted"], cos["size"]) == (30, 16)
    # one outlier holding nearly all of it: start at 1, as the doubling ladder always did
    assert predicted_first_size(ranked(1.0, 0.01, 0.01), row, 0.95)["size"] == 1
    # no prediction from a one-pass ranking (each node's own error), a broken ranking, or a met target
    own = [{**r, "sqnr_db": 20.0} for r in spread]
    assert predicted_first_size(own, row, 0.95)["predicted"] is None
    assert predicted_first_size(ranked(0.1, float("inf")), row, 0.95)["size"] == 1
    assert predicted_first_size(spread, {"metric": "cosine", "score": 0.99}, 0.95)["predicted"] is None


def test_a_passing_first_size_is_bisected_down_to_the_smallest_passing_set() -> None:
    from edgedeploy.precision.fallback import FamilySearch

    made: list[tuple[str, int]] = []

    def attempt(k: int, excl: dict[str, str], family: str = "") -> tuple[bool, Path]:
        made.append((family, k))
        return {"A", "B", "C"} <= set(excl), Path(f"{family}{k}.onnx")

    rows = [{"node": n, "op": "Conv", "output_error": 0.1} for n in "ABCDEFGH"]
    search = FamilySearch(attempt, {}, rows, list("HGFEDCBA"), lambda: len(made) < 12)
    assert search.grow_both(first=4) == "sensitivity"
    search.bisect("sensitivity")
    # sizes 1 and 2 were never tried before 4 passed; bisection from 0 finds 3, as growing from 1 would have
    assert made == [("sensitivity", 4), ("sensitivity", 2), ("sensitivity", 3)]
    assert search.passed["sensitivity"] == 3 and search.failed["sensitivity"] == 2


def test_run_model_batches_single_feeds_into_one_call_with_the_same_outputs(tmp_path: Path) -> None:
    import onnxruntime as ort

    batches = [{"image": b["image"][:1]} for b in photo_batches(16, 8)] + photo_batches(8, 4)
    path = export_onnx(outlier_net(), batches[0]["image"], tmp_path / "outlier.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    one_by_one = [dict(zip(["logits"], sess.run(["logits"], b))) for b in batches]
    got = analysis.run_model(path, batches)
    assert [g["logits"].shape for g in got] == [o["logits"].shape for o in one_by_one]
    for g, o in zip(got, one_by_one):
        np.testing.assert_allclose(g["logits"], o["logits"], rtol=1e-5, atol=1e-6)
    groups = analysis.batch_groups(batches, analysis.BATCH_ROWS)
    assert len(groups) < len(batches) and all(sum(len(b["image"]) for b in g) <= analysis.BATCH_ROWS for g in groups)


def _deep_outlier_net():  # type: ignore[no-untyped-def]
    """outlier_net's first layers (the 1000x channel early) followed by three near-identity 1x1 convs: a float
    prefix of three nodes fixes it, and that is under half the quantized nodes."""
    import torch
    from torch import nn

    net = outlier_net()

    class Deeper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = net
            self.tail = nn.Sequential(*(m for _ in range(3) for m in (nn.Conv2d(8, 8, 1), nn.ReLU())))
            with torch.no_grad():  # near-identity: c2's output (where the outlier hurts) reaches the logits
                for conv in self.tail[::2]:
                    conv.weight.copy_(torch.eye(8).view(8, 8, 1, 1) + 0.05 * torch.randn(8, 8, 1, 1))
                    conv.bias.zero_()

        def forward(self, image):  # type: ignore[no-untyped-def]
            b = self.base
            y = torch.relu(b.c1(image)) * b.gain
            return b.fc(self.tail(torch.relu(b.c2(y))).mean((2, 3)))

    torch.manual_seed(1)
    return Deeper()


def test_prefix_first_ships_a_passing_float_prefix_without_ranking_any_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgedeploy.precision import fallback

    ranked: list[int] = []
    monkeypatch.setattr(fallback, "layer_sensitivity", lambda *a, **k: ranked.append(1) or [])
    batches = photo_batches(16, 8)
    path = export_onnx(_deep_outlier_net(), batches[0]["image"], tmp_path / "deep.onnx")
    q = Quantizer(preprocess(path, tmp_path / "float.onnx"), tmp_path, flavour_for("onnxruntime"))
    result = quantize_with_fallback(
        q, out=tmp_path / "m.int8.onnx", batches=batches, classifier_outputs=[], accuracy_target=0.99, max_tries=8,
        prefix_first=True,
    )  # fmt: skip
    assert result.met and result.final["family"] == "prefix" and result.sensitivity == [] and not ranked
    assert {t.get("family") for t in result.tries[1:]} == {"prefix"}
    assert result.stop.startswith("smallest passing float set found (prefix: ")
    assert "/c2/Conv" in result.excluded and all("float prefix" in why for why in result.excluded.values())
    assert result.choice["rule"].startswith("prefix first")
    ref = analysis.run_model(q.float_model, batches)
    assert analysis.accuracy(ref, analysis.run_model(tmp_path / "m.int8.onnx", batches), [])["score"] >= 0.99


def test_prefix_first_ranks_the_nodes_when_no_prefix_up_to_half_of_them_passes(tmp_path: Path) -> None:
    result, _, _ = _search(tmp_path, None, prefix_first=True)  # the outlier sits past half of outlier_net's nodes
    families = [(t.get("family"), t["float_nodes"]) for t in result.tries[1:]]
    half = max(1, result.candidates // 2)
    prefix_tries = [k for f, k in families if f == "prefix"]
    assert families[: len(prefix_tries)] == [("prefix", k) for k in prefix_tries] and max(prefix_tries) == half
    assert not any(t["met"] for t in result.tries if t.get("family") == "prefix")
    assert result.sensitivity and result.met and result.final["family"] == "sensitivity"
    assert set(result.excluded) == {"/Mul", "/c2/Conv"}


def test_a_settled_bisection_ships_the_smallest_passing_prefix_found_and_says_why(tmp_path: Path) -> None:
    batches = photo_batches(16, 8)
    path = export_onnx(_deep_outlier_net(), batches[0]["image"], tmp_path / "deep.onnx")
    q = Quantizer(preprocess(path, tmp_path / "float.onnx"), tmp_path, flavour_for("onnxruntime"))
    asked: list[tuple[list[str], str]] = []

    def settled(undecided, int8_model):  # type: ignore[no-untyped-def]
        asked.append((list(undecided), int8_model.name))
        return "too few multiply-adds left" if len(undecided) <= 2 else None

    result = quantize_with_fallback(
        q, out=tmp_path / "m.int8.onnx", batches=batches, classifier_outputs=[], accuracy_target=0.99, max_tries=8,
        prefix_first=True, settled=settled,
    )  # fmt: skip
    # unsettled, this search tries prefixes 4 (passes), 2 (fails) and 3 (passes): 3 is its smallest
    assert [(t.get("family"), t["float_nodes"], t["met"]) for t in result.tries[1:]] == [
        ("prefix", 4, True),
        ("prefix", 2, False),
    ]
    # asked with the nodes float in the passing set and not in the failing one, and the all-INT8 model
    first, second = asked
    assert len(first[0]) == 4 and second[0] == first[0][2:] and {m for _, m in asked} == {"try0.int8.onnx"}
    assert result.met and result.final["float_nodes"] == 4 and len(result.excluded) == 4
    assert result.stop == (
        "a passing float set found (prefix: 4 float, 2 failed); bisection stopped: too few multiply-adds left"
    )


def test_each_try_counts_the_pinned_float_nodes_apart_from_the_ones_it_chose(tmp_path: Path) -> None:
    """A node pinned float (precision.keep_fp32) is float in every try: each row counts it as ``pinned_float``,
    apart from ``float_nodes`` (what the search chose), and the progress line says so."""
    from edgedeploy.precision.search_progress import SearchProgress

    batches = photo_batches(16, 8)
    path = export_onnx(outlier_net(), batches[0]["image"], tmp_path / "outlier.onnx")
    float_model = preprocess(path, tmp_path / "float.onnx")
    q = Quantizer(float_model, tmp_path, flavour_for("onnxruntime"))
    first = analysis.quantized_nodes(onnx.load(str(q.quantize(tmp_path / "all.int8.onnx", batches))))
    said: list[str] = []
    progress = SearchProgress(max_tries=8, target=0.99, status=said.append)
    result = quantize_with_fallback(
        q, out=tmp_path / "m.int8.onnx", batches=batches, classifier_outputs=[], accuracy_target=0.99, max_tries=8,
        keep_fp32=[first[-1]], on_try=progress,
    )  # fmt: skip
    assert len(result.tries) > 1
    for row, line in zip(result.tries, said):
        assert row["pinned_float"] == 1 and first[-1] in row["excluded"]
        assert len(row["excluded"]) == row["float_nodes"] + 1
        assert f"{row['float_nodes']} float nodes" in line and "(+1 pinned)" in line
