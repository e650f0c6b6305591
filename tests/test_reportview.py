"""The host's typed view of report.json: the gate and the results table read it, naming any key of the wrong type."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from edgedeploy.cli import main
from edgedeploy.errors import InputError
from edgedeploy.pipeline.report import results_table
from edgedeploy.reportview import ReportView


def _report(**over: Any) -> dict[str, Any]:
    row = {"check": "parity", "output": "logits", "shape": "opt", "sample": 0, "passed": True, "max_abs": 1e-6}
    report: dict[str, Any] = {
        "schema": "edgedeploy-report/1",
        "status": "passed",
        "target": "cpu",
        "parity": {
            "status": "passed",
            "candidates": [
                {"name": "onnxruntime-fp32", "status": "passed", "precision": "fp32", "deploy": True, "checks": [row]},
                {"name": "tensorrt", "status": "skipped", "reason": "no TensorRT", "checks": []},
            ],
        },
        "latency": {"status": "measured", "backends": {"onnxruntime-fp32": {"p50_ms": 0.5, "throughput": 4000}}},
        "warnings": ["w"],
    }
    report.update(over)
    return report


def test_a_report_reads_as_typed_fields() -> None:
    view = ReportView.parse(_report())
    ort, trt = view.parity.candidates
    assert (ort.name, ort.deploy, ort.checks[0].max_abs, ort.checks[0].where) == (
        "onnxruntime-fp32",
        True,
        1e-6,
        "opt#0",
    )
    assert trt.status == "skipped" and trt.reason == "no TensorRT" and view.parity.candidate("tensorrt") == trt
    assert view.latency.backends["onnxruntime-fp32"].value("p50_ms") == 0.5 and view.warnings == ("w",)
    assert view.error is None and view.raw["target"] == "cpu"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"parity": {"candidates": [{"checks": "none"}]}}, "parity.candidates[0].checks must be a list, got 'none'"),
        (
            {"parity": {"candidates": [{"checks": [{"cosine": "high"}]}]}},
            "parity.candidates[0].checks[0].cosine must be a finite number, got 'high'",
        ),
        ({"latency": {"backends": {"ort": {"p50_ms": True}}}}, "latency.backends.ort.p50_ms must be a finite number"),
        ({"schema": "other/1"}, "not an edgedeploy report"),
    ],
)
def test_a_key_of_the_wrong_type_is_an_input_error_naming_it(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ReportView.parse(_report(**change), "out/report.json")


def test_deploy_gate_on_a_damaged_report_exits_3_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_report(status="failed", parity={"candidates": [{"name": "x", "checks": "none"}]})))
    assert main(["gate", str(path)]) == InputError.exit_code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}: parity.candidates[0].checks must be a list" in err[0]


def test_a_baseline_whose_latency_is_no_measurement_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, old = tmp_path / "report.json", tmp_path / "old.json"
    good.write_text(json.dumps(_report()))
    old.write_text(json.dumps(_report(latency={"backends": {"onnxruntime-fp32": {"p50_ms": 0}}})))
    assert main(["gate", str(good), "--baseline", str(old)]) == InputError.exit_code
    assert re.search(r"onnxruntime-fp32 p50_ms = 0(\.0)? is not a latency measurement", capsys.readouterr().err)


def test_the_results_table_reads_the_view() -> None:
    table = results_table(_report())
    assert re.search(r"^onnxruntime-fp32 +opt +0  logits ", table, re.M)  # one row per check, with its sample
    assert "tensorrt         skipped: no TensorRT" in table
    assert re.search(r"^  opt +the same at the opt shape$", table, re.M)  # the legend explains the labels used
    assert "  min " not in table and "  x" not in table  # and only those
    assert re.search(r"^onnxruntime-fp32 +0\.500 +- +- +4000\.0$", table, re.M)
    assert "cached" not in table
    measured = {"p50_ms": 0.5, "throughput": 4000}
    cached = {"status": "measured", "cached": True, "measured_at": "2026-01-02 03:04:05 UTC"}
    table = results_table(_report(latency={**cached, "backends": {"onnxruntime-fp32": measured}}))
    assert "latency (cached: measured 2026-01-02 03:04:05 UTC by an earlier build, not in this run;" in table
    with pytest.raises(InputError, match="parity.candidates"):
        results_table(_report(parity={"candidates": "x"}))


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"cosine": float("nan")}, "cosine must be a finite number, got nan"),
        ({"cosine": 1.5}, "cosine must be a number from -1 to 1"),
        ({"max_abs": -1.0}, "max_abs must be a number from 0 up"),
        ({"top1_agreement": 2.0}, "top1_agreement must be a number from 0 to 1"),
        ({"nan": -5}, "nan must be a whole number of at least 0"),
    ],
)
def test_a_figure_no_build_writes_is_refused_not_compared(row: dict[str, Any], message: str) -> None:
    """NaN, a negative error or count, a cosine above 1: each would slip past the minimum it is compared with."""
    with pytest.raises(InputError, match=re.escape(message)):
        ReportView.parse(_report(parity={"candidates": [{"name": "x", "status": "passed", "checks": [row]}]}), "r")


@pytest.mark.parametrize(("field", "value"), [("precision", "get"), ("precision", "int4"), ("status", "ok")])
def test_a_candidate_precision_or_status_outside_the_schema_is_refused(field: str, value: str) -> None:
    """A precision the policy has no minimum for would make every per-precision minimum pass in silence."""
    cand = {"name": "x", "status": "passed", "precision": "fp32", "checks": [], field: value}
    with pytest.raises(InputError, match=f"{field} must be one of"):
        ReportView.parse(_report(parity={"candidates": [cand]}), "r")


def test_a_per_precision_minimum_answers_only_for_precisions() -> None:
    from edgedeploy.policy import PerPrecision

    minimum = PerPrecision(fp32=0.99, int8=0.95)
    assert (minimum.get("fp32"), minimum.get("fp16"), minimum.get("int8")) == (0.99, None, 0.95)
    assert minimum.get("get") is None and minimum.get("__class__") is None
