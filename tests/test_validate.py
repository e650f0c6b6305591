"""Parity validation of every backend a build produced: metrics, tolerances per precision, batch consistency."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import write_unique_tiny_project

from edgedeploy.errors import ArtifactIntegrityError, ParityError
from edgedeploy.validate.parity import (
    NON_FINITE,
    OUTSIDE_TOLERANCE,
    add_to_histogram,
    batch_consistency,
    compare_output,
    empty_histogram,
    pooled_top1,
)

# one xdist worker runs this module, so its module-scoped build fixture runs once (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_validate")


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from edgedeploy.config import load_config
    from edgedeploy.pipeline.runner import run_build

    folder = tmp_path_factory.mktemp("tiny")
    path = write_unique_tiny_project(folder)
    cfg = load_config(path)
    return cfg, run_build(cfg, log=lambda _: None)


def _context(cfg: Any, out: Path, staging: Path) -> Any:
    from edgedeploy.stages.base import BuildContext
    from edgedeploy.targets import get_target

    shutil.copytree(out, staging)
    ckpt = cfg.path(cfg.model.checkpoint)
    return BuildContext(cfg=cfg, target=get_target("cpu"), staging=staging, out=out, external={"checkpoint": ckpt})


def _candidates(metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in metrics["parity"]["candidates"]}


# ---- numpy-level rules ------------------------------------------------------------------------------


def test_non_finite_output_never_passes_even_without_tolerances() -> None:
    ref = np.ones((2, 3), np.float32)
    cand = ref.copy()
    cand[1, 2] = np.nan
    cand[0, 0] = np.inf
    row = compare_output(ref, cand, atol=None, rtol=None, min_cosine=None)
    assert row["passed"] is False
    assert row["failure"] == [NON_FINITE]
    assert (row["nan"], row["inf"]) == (1, 1)
    assert row["reason"].startswith(f"{NON_FINITE}: 1 NaN and 1 Inf")
    assert compare_output(ref, ref.copy(), atol=None, rtol=None, min_cosine=None)["passed"] is True


def test_metrics_and_topk_for_classifier_outputs() -> None:
    ref = np.array([[3.0, 2.0, 1.0], [0.0, 1.0, 2.0]], np.float32)
    cand = np.array([[3.0, 2.0, 1.0], [2.5, 1.0, 2.0]], np.float32)  # row 1's top-1 flips
    row = compare_output(
        ref, cand, atol=1e-3, rtol=0.0, min_cosine=0.5, min_topk_agreement=0.9, topk=2, classifier=True
    )
    assert row["max_abs"] == pytest.approx(2.5)
    assert row["top1_agreement"] == pytest.approx(0.5)
    assert row["topk_overlap"] == pytest.approx(0.75)
    assert set(row["failure"]) == {OUTSIDE_TOLERANCE, "top-k agreement"}
    assert row["p99_abs"] <= row["max_abs"] and row["p99_rel"] <= row["max_rel"]


def _golden_rows(point: str, flips: int, n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """``n`` batch-1 classifier goldens at ``point``, the first ``flips`` of them with their top-1 swapped."""
    rows = []
    for i in range(n):
        ref = rng.normal(size=(1, 10)).astype(np.float32)
        cand = ref.copy()
        if i < flips:
            top, second = np.argsort(-ref[0])[:2]
            cand[0, [top, second]] = ref[0, [second, top]]
        row = compare_output(ref, cand, min_cosine=0.0, classifier=True)
        rows.append(dict(row, shape=point, sample=i, output="logits"))
    return rows


def test_top1_is_judged_pooled_over_real_samples_not_per_golden_or_on_random_inputs() -> None:
    rng = np.random.default_rng(0)
    real_ok = _golden_rows("data", 1, 10, rng) + _golden_rows("calib-heldout", 0, 10, rng)  # 19 of 20: 0.95
    noise = _golden_rows("min", 1, 1, rng)  # a spec-random golden whose near-tie flipped
    assert all(r["passed"] for r in real_ok + noise)  # no per-golden top-1 verdict (batch 1 agrees 0 or 1)
    (pooled,) = pooled_top1(real_ok + noise, 0.95)
    assert pooled["check"] == "top1_agreement" and pooled["shape"] == "real" and pooled["sample"] is None
    assert pooled["rows"] == 20 and pooled["top1_agreement"] == pytest.approx(0.95) and pooled["passed"]
    (failing,) = pooled_top1(_golden_rows("data", 2, 20, rng), 0.95)  # 18 of 20: 0.90
    assert not failing["passed"] and failing["failure"] == ["top-k agreement"]
    assert "18 of 20 real samples" in failing["reason"]
    # no real-sample goldens: the spec-random ones are pooled (the rule before real data existed)
    (spec_only,) = pooled_top1(_golden_rows("opt", 1, 4, rng), 0.95)
    assert spec_only["shape"] == "all" and spec_only["top1_agreement"] == pytest.approx(0.75)
    assert not spec_only["passed"]
    assert pooled_top1(real_ok, None) == []  # no top-1 tolerance: no row
    from edgedeploy.precision.data import HELDOUT_POINT
    from edgedeploy.validate.parity import REAL_DATA_POINTS

    assert HELDOUT_POINT in REAL_DATA_POINTS  # held-out calibration goldens count as real samples


def test_error_histogram_counts_every_value() -> None:
    hist = empty_histogram()
    ref = np.zeros(100, np.float32)
    cand = np.concatenate([np.zeros(10), np.full(60, 1e-6), np.full(29, 1e-2), [np.nan]]).astype(np.float32)
    add_to_histogram(hist, ref, cand)
    add_to_histogram(hist, ref, cand)
    assert hist["exact"] == 20 and hist["non_finite"] == 2
    assert sum(hist["counts"]) == 2 * 89
    assert len(hist["counts"]) == len(hist["edges"]) - 1


def test_batch_consistency_flags_rows_that_differ() -> None:
    same = {"logits": np.tile(np.arange(4, dtype=np.float32), (3, 1)), "scalar": np.float32(1.0) * np.ones(())}
    rows = batch_consistency(same, 3, atol=1e-6, rtol=0.0)
    assert [r.get("passed") for r in rows] == [True, True] and "skipped" in rows[1]
    drift = {"logits": same["logits"] + np.arange(3, dtype=np.float32)[:, None] * 1e-3}
    (row,) = batch_consistency(drift, 3, atol=1e-6, rtol=0.0)
    assert row["passed"] is False and row["failure"] == [OUTSIDE_TOLERANCE]


# ---- the stage on a real build ---------------------------------------------------------------------------


def test_every_backend_is_validated_at_min_opt_max(tiny_build: tuple[Any, Any]) -> None:
    from edgedeploy.pipeline.report import results_table

    cfg, result = tiny_build
    parity = result.report["parity"]
    cands = {c["name"]: c for c in parity["candidates"]}
    assert set(cands) == {"torchscript", "onnxruntime-fp32", "tensorrt"}
    assert cands["tensorrt"] == {"name": "tensorrt", "status": "skipped", "reason": "no TensorRT", "checks": []}
    assert "tensorrt         skipped: no TensorRT" in results_table(result.report)
    for name in ("torchscript", "onnxruntime-fp32"):
        cand = cands[name]
        assert cand["status"] == "passed" and cand["precision"] == "fp32"
        parity_rows = [c for c in cand["checks"] if c["check"] == "parity"]
        assert {c["shape"] for c in parity_rows} == {"min", "opt", "max"}
        for row in parity_rows:
            for key in ("max_abs", "p99_abs", "max_rel", "p99_rel", "cosine", "nan", "inf", "top1_agreement"):
                assert key in row, key
            assert row["max_abs"] <= cfg.tolerance_for("fp32").atol + 1e-3
        (batch,) = [c for c in cand["checks"] if c["check"] == "batch_consistency"]
        assert batch["passed"] and batch["rows"] == cfg.dims["batch"].max and batch["shape"] == "x4"
        assert sum(cand["histograms"]["logits"]["counts"]) + cand["histograms"]["logits"]["exact"] == sum(
            int(np.prod(r["shape_ref"])) for r in parity_rows
        )
    assert cands["onnxruntime-fp32"]["deploy"] is True and cands["torchscript"]["deploy"] is False
    lat = result.report["latency"]
    assert set(lat["backends"]) == {"torchscript", "onnxruntime-fp32"}
    assert lat["skipped"] == {"tensorrt": "no TensorRT"}
    for row in lat["backends"].values():
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
        assert row["batch"] == cfg.dims["batch"].opt and row["throughput"] > 0
        assert row["iters"] == cfg.validate.latency_iters and row["warmup"] == cfg.validate.latency_warmup


def test_variants_are_judged_with_their_precision_tolerance(tiny_build: tuple[Any, Any], tmp_path: Path) -> None:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from edgedeploy.config import Tolerance
    from edgedeploy.stages.validate import ParityFromGoldens

    cfg, result = tiny_build
    ctx = _context(cfg, result.out, tmp_path / "staging")
    fp16 = convert_float_to_float16(onnx.load(str(ctx.staging / "model.onnx")), keep_io_types=True)
    onnx.save(fp16, str(ctx.staging / "model.fp16.onnx"))
    cands = _candidates(ParityFromGoldens().run(ctx).metrics)
    half = cands["onnxruntime-fp16"]
    assert half["status"] == "passed" and half["tolerance"] == cfg.tolerance_for("fp16").__dict__
    worst16 = max(c["max_abs"] for c in half["checks"] if c["check"] == "parity")
    worst32 = max(c["max_abs"] for c in cands["onnxruntime-fp32"]["checks"] if c["check"] == "parity")
    assert worst16 > worst32  # it really ran in half precision

    strict = dataclasses.replace(cfg, tolerance={"fp16": Tolerance(atol=1e-7, rtol=0.0)})
    ctx = _context(strict, result.out, tmp_path / "strict")
    onnx.save(fp16, str(ctx.staging / "model.fp16.onnx"))
    with pytest.raises(ParityError) as err:
        ParityFromGoldens().run(ctx)
    cands = _candidates(err.value.partial.metrics)
    assert cands["onnxruntime-fp16"]["status"] == "failed" and cands["onnxruntime-fp32"]["status"] == "passed"
    assert "1 backend(s) disagree with PyTorch (onnxruntime-fp16)" in err.value.message
    assert OUTSIDE_TOLERANCE in err.value.message


def _add_row_dependent_shift(src: Path, dst: Path) -> None:
    """Rewrite the model so row k of 'logits' gets k * 0.01 added: identical rows no longer agree."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(src))
    g = model.graph
    for node in g.node:
        node.output[:] = ["logits_raw" if o == "logits" else o for o in node.output]
    g.node.extend(
        [
            helper.make_node("Shape", ["logits_raw"], ["rows_shape"]),
            helper.make_node("ConstantOfShape", ["rows_shape"], ["ones"], value=helper.make_tensor("v", 1, [1], [1.0])),
            helper.make_node("CumSum", ["ones", "axis0"], ["index1"]),
            helper.make_node("Sub", ["index1", "one"], ["index"]),
            helper.make_node("Mul", ["index", "step"], ["shift"]),
            helper.make_node("Add", ["logits_raw", "shift"], ["logits"]),
        ]
    )
    g.initializer.extend(
        [
            helper.make_tensor("axis0", TensorProto.INT64, [], [0]),
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
            helper.make_tensor("step", TensorProto.FLOAT, [], [0.01]),
        ]
    )
    onnx.save(model, str(dst))


def test_row_dependent_candidate_fails_batch_consistency(tiny_build: tuple[Any, Any], tmp_path: Path) -> None:
    from edgedeploy.stages.validate import ParityFromGoldens

    cfg, result = tiny_build
    ctx = _context(cfg, result.out, tmp_path / "staging")
    _add_row_dependent_shift(result.out / "model.onnx", ctx.staging / "model.onnx")
    with pytest.raises(ParityError) as err:
        ParityFromGoldens().run(ctx)
    cand = _candidates(err.value.partial.metrics)["onnxruntime-fp32"]
    batch = [c for c in cand["checks"] if c["check"] == "batch_consistency"]
    assert len(batch) == 1 and not batch[0]["passed"] and OUTSIDE_TOLERANCE in batch[0]["failure"]
    by_shape = {c["shape"]: c["passed"] for c in cand["checks"] if c["check"] == "parity"}
    assert by_shape == {"min": True, "opt": False, "max": False}  # batch 1 has only row 0


def test_backend_that_cannot_run_is_one_finding_among_all(tiny_build: tuple[Any, Any], tmp_path: Path) -> None:
    from edgedeploy.stages.validate import ParityFromGoldens

    cfg, result = tiny_build
    ctx = _context(cfg, result.out, tmp_path / "staging")
    (ctx.staging / "model.int8.onnx").write_bytes(b"this is not an onnx model")
    with pytest.raises(ParityError) as err:
        ParityFromGoldens().run(ctx)
    cands = _candidates(err.value.partial.metrics)
    assert cands["onnxruntime-int8"]["status"] == "failed"
    assert cands["onnxruntime-int8"]["reason"].startswith("cannot run:")
    assert cands["onnxruntime-fp32"]["status"] == "passed" and cands["torchscript"]["status"] == "passed"
    assert "onnxruntime-int8: cannot run:" in err.value.message
    assert "onnxruntime-int8" in err.value.partial.metrics["latency"]["skipped"]


def test_torchscript_is_loaded_only_with_its_recorded_hash(tiny_build: tuple[Any, Any]) -> None:
    from edgedeploy.fileio.hashing import sha256_file
    from edgedeploy.validate.runners import load_torchscript

    _, result = tiny_build
    path = result.out / "model.ts"
    assert load_torchscript(path, sha256_file(path)) is not None
    with pytest.raises(ArtifactIntegrityError, match="refusing to load"):
        load_torchscript(path, "0" * 64)


def test_throughput_counts_the_timed_runs_not_the_median() -> None:
    """One slow run in five: p50 stays fast, throughput (batches / their summed time) pays for it."""
    from edgedeploy.validate.latency import time_calls

    own = iter([0.001, 0.001, 0.001, 0.001, 0.1])  # seconds the backend reports per timed run
    feeds = {"x": np.zeros((4, 3), np.float32)}
    row = time_calls(lambda _f: None, feeds, warmup=0, iters=5, own_time=lambda: next(own))
    assert row["p50_ms"] == pytest.approx(1.0)
    assert row["batches_per_s"] == pytest.approx(5 / 0.104)
    assert row["throughput"] == pytest.approx(4 * 5 / 0.104)  # 192 samples/s, not the 4000 that 1/p50 gives


def test_each_onnx_backend_loads_one_session_and_runs_each_input_once(
    tiny_build: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sessions are real ONNX Runtime ones, counted as they are made and run: one per ONNX model, and each golden
    input, the repeated-row batches (N rows, and N - 1 to tell which outputs follow the batch) and the latency runs
    once each."""
    import onnxruntime

    from edgedeploy.modelio.goldens import load_goldens
    from edgedeploy.stages.validate import ParityFromGoldens

    made: list[str] = []
    runs: dict[str, list[tuple[int, ...]]] = {}

    class CountingSession(onnxruntime.InferenceSession):
        def __init__(self, path: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(path, *args, **kwargs)
            self.counted_as = Path(str(path)).name
            made.append(self.counted_as)

        def run(self, output_names: Any, input_feed: Any, *args: Any, **kwargs: Any) -> Any:
            runs.setdefault(self.counted_as, []).append(tuple(np.asarray(input_feed["image"]).shape))
            return super().run(output_names, input_feed, *args, **kwargs)

    cfg, result = tiny_build
    ctx = _context(cfg, result.out, tmp_path / "staging")
    shutil.copy(ctx.staging / "model.onnx", ctx.staging / "model.fp16.onnx")  # a second ONNX candidate
    monkeypatch.setattr(onnxruntime, "InferenceSession", CountingSession)
    metrics = ParityFromGoldens().run(ctx).metrics
    assert sorted(made) == ["model.fp16.onnx", "model.onnx"]
    goldens = [
        pair["in"]["image"].shape
        for by_sample in load_goldens(ctx.path("goldens.npz")).values()
        for pair in by_sample.values()
    ]
    v = cfg.validate
    opt = (cfg.dims["batch"].opt, 3, 16, 16)
    for name in ("model.onnx", "model.fp16.onnx"):
        repeated = [(cfg.dims["batch"].max, 3, 16, 16), (cfg.dims["batch"].max - 1, 3, 16, 16)]  # N, then N - 1 rows
        want = [*goldens, *repeated, *[opt] * (v.latency_warmup + v.latency_iters)]
        assert runs[name] == want, name
    assert {"onnxruntime-fp32", "onnxruntime-fp16"} <= set(metrics["latency"]["backends"])


def test_held_out_goldens_run_in_the_reference_calls_and_each_input_gets_its_own_outputs(
    tiny_build: tuple[Any, Any],
) -> None:
    """The held-out calibration goldens run joined as the reference joined them (up to the max batch a call), once
    checked against one input alone, every other golden alone; each input's outputs equal its own run's."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from edgedeploy.precision.data import HELDOUT_POINT
    from edgedeploy.precision.golden_feeds import max_batch_rows, reference_calls
    from edgedeploy.validate.runners import infer_calls

    cfg, result = tiny_build
    rows = max_batch_rows(cfg)
    assert rows > 1
    rng = np.random.default_rng(0)
    points = ["min", "opt", "max", *[HELDOUT_POINT] * (rows + 2), "data"]
    feeds = [{"image": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in points]
    calls = reference_calls(cfg, points, feeds)
    held = list(range(3, 3 + rows + 2))
    assert calls == sorted([[0], [1], [2], held[:rows], held[rows:], [len(points) - 1]])
    batch_sizes: list[int] = []

    class Counting(OnnxrtRunner):  # type: ignore[misc]
        def infer(self, feed_dict: Any, *args: Any, **kwargs: Any) -> Any:
            batch_sizes.append(len(feed_dict["image"]))
            return super().infer(feed_dict, *args, **kwargs)

    with Counting(SessionFromOnnx(str(result.out / "model.onnx"), providers=["cpu"])) as runner:
        got = infer_calls(runner, feeds, calls)
        joined = [len(call) for call in calls]
        first = joined.index(rows)  # the first joined call's last input runs alone once, to check joining
        assert batch_sizes == [*joined[: first + 1], 1, *joined[first + 1 :]]
        alone = [{k: np.array(v) for k, v in runner.infer(f).items()} for f in feeds]
    for joined, own in zip(got, alone):
        assert joined.keys() == own.keys()
        for name in own:
            np.testing.assert_allclose(joined[name], own[name], rtol=1e-5, atol=1e-6)


def test_a_model_that_ignores_its_input_is_vacuous_and_fails_however_its_classes_differ() -> None:
    from edgedeploy.validate.parity import judge_goldens

    rng = np.random.default_rng(0)
    dead = np.array([[0.1, -0.4, 0.9]], np.float32)  # fc(x * 0): its bias, the same for every input
    cases = [("opt", i, {"out": {"y": dead}}) for i in range(3)] + [("data", 0, {"out": {"y": dead}})]
    got = [{"y": dead.copy()} for _ in cases]
    rows = judge_goldens(cases, got, "fp32", {"atol": 1e-5, "rtol": 1e-3}, outputs=["y"])
    per_golden = [r for r in rows if r.get("sample") is not None]
    assert all(r["passed"] and r["vacuous"] for r in per_golden)  # each agrees, and says nothing
    (verdict,) = [r for r in rows if r.get("check") == "vacuous"]
    assert not verdict["passed"] and verdict["reason"].startswith("vacuous: every compared output is constant")
    # a model whose output follows its input is not vacuous, even where one golden's output is constant
    live = [np.round(rng.normal(size=(1, 3)), 3).astype(np.float32) for _ in cases]
    rows = judge_goldens(
        [(p, s, {"out": {"y": v}}) for (p, s, _), v in zip(cases, live)], [{"y": v} for v in live], "fp32",
        {"atol": 1e-5, "rtol": 1e-3}, outputs=["y"],
    )  # fmt: skip
    assert not any(r.get("vacuous") for r in rows) and all(r["passed"] for r in rows)


def test_a_repeated_row_batch_of_a_one_value_output_is_consistent_not_vacuous() -> None:
    (row,) = batch_consistency({"p": np.full((4, 1), 0.7, np.float32)}, 4, atol=1e-5)
    assert row["passed"] and not row["vacuous"]


def test_a_constant_model_fails_its_build_with_the_reason(tmp_path: Path) -> None:
    from test_capture import make_config, quiet

    from edgedeploy.pipeline.runner import run_build

    constant = """
        import torch
        from torch import nn

        class Constant(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(3, 5)

            def forward(self, x):
                return self.fc(x.mean((2, 3)) * 0.0)

        def build():
            return Constant()
        """
    cfg = make_config(tmp_path, constant)
    with pytest.raises(ParityError) as caught:
        run_build(cfg, log=quiet)
    assert "vacuous: every compared output is constant, in PyTorch and here, whatever the input" in str(caught.value)


FIXED_TABLE_MODEL = """
import torch
from torch import nn


class TableAndLogits(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 3)
        self.table = nn.Parameter(torch.arange(12.0).reshape(4, 3))  # 4 rows whatever the batch

    def forward(self, x):
        return self.head(x), self.table + x.mean()


def build():
    torch.manual_seed(0)
    return TableAndLogits()
"""


def test_an_output_whose_length_only_equals_the_batch_is_not_judged_row_by_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, test_cache: Path
) -> None:
    import json
    import uuid

    from edgedeploy.cli import main

    name = f"table_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(FIXED_TABLE_MODEL)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    argv = ["build", "--factory", f"{name}:build", "--input", "x:batchx8", "--dim", "batch=1:2:4", "--output", "y",
            "--output", "table", "--samples", "1", "--latency-iters", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0  # the table's 4 rows differ, and are no sample's
    cands = {c["name"]: c for c in json.loads((out / "report.json").read_text())["parity"]["candidates"]}
    for backend in ("torchscript", "onnxruntime-fp32"):
        (batch,) = [c for c in cands[backend]["checks"] if c["check"] == "batch_consistency"]
        assert batch["output"] == "y" and batch["passed"] and batch["rows"] == 4


def test_batch_consistency_skips_outputs_not_seen_to_follow_the_batch() -> None:
    rows = np.tile(np.arange(3, dtype=np.float32), (4, 1))
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = batch_consistency({"y": rows, "table": table}, 4, atol=1e-6, rtol=0.0, batch_major={"y"})
    assert [(r["output"], r["passed"], "skipped" in r) for r in got] == [("y", True, False), ("table", True, True)]
    (judged,) = [r for r in batch_consistency({"table": table}, 4, atol=1e-6, rtol=0.0) if "skipped" not in r]
    assert judged["passed"] is False  # without the knowledge, the table's rows are compared
