"""The release gate: each exit code, from ``deploy gate`` and from ``deploy build`` with a policy."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import write_unique_tiny_project

from edgedeploy.cli import main
from edgedeploy.fileio.hashing import sha256_file
from edgedeploy.validate.gate import run_gate

# one xdist worker runs this module, so its module-scoped build fixture runs once (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_gate")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy.toml of a tiny project, built once into its 'out' folder (later builds hit the cache)."""
    folder = tmp_path_factory.mktemp("gate")
    path = write_unique_tiny_project(folder)
    assert main(["build", "--config", str(path)]) == 0
    return path


@pytest.fixture
def build(project: Path, tmp_path: Path) -> Path:
    """A private copy of the finished build folder."""
    dst = tmp_path / "build"
    shutil.copytree(project.parent / "out", dst, ignore=shutil.ignore_patterns(".cache"))
    return dst


def _edit_report(folder: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Change report.json and record its new hash in the manifest (a consistent, untampered build)."""
    report = json.loads((folder / "report.json").read_text())
    edit(report)
    (folder / "report.json").write_text(json.dumps(report))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["artifacts"]["report.json"] = sha256_file(folder / "report.json")
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _policy(tmp_path: Path, text: str) -> str:
    path = tmp_path / "gate.toml"
    path.write_text(text)
    return str(path)


def _gate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    code = main(["gate", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_clean_build_passes(build: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _gate(capsys, str(build))
    assert code == 0
    assert len(out) == 1 and out[0].startswith("gate passed (") and err == ""
    code, out, _ = _gate(capsys, str(build), "--json")
    verdict = json.loads("\n".join(out))
    assert code == 0 and verdict["status"] == "passed" and verdict["exit_code"] == 0
    kinds = {c["kind"] for c in verdict["checks"]}
    assert {"integrity", "parity", "batch_consistency"} <= kinds


def test_tampered_artifact_exits_9(build: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = bytearray((build / "model.onnx").read_bytes())
    data[-1] ^= 0xFF
    (build / "model.onnx").write_bytes(bytes(data))
    code, out, err = _gate(capsys, str(build / "report.json"))
    assert code == 9
    assert out == [f"FAIL integrity: {build}: model.onnx sha256 differs from manifest (tampered or replaced)"]
    assert err.startswith("deploy: artifact integrity error: release gate failed: integrity:")
    assert "fix: rebuild into this folder" in err  # a fix, not a pointer to the lines above
    assert len(err.strip().splitlines()) == 1


def test_missing_artifact_exits_9_before_anything_else(
    build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (build / "model.ts").unlink()
    policy = _policy(tmp_path, "max_latency_ms = 0.000001\n")  # also too slow: integrity still decides
    code, out, _ = _gate(capsys, str(build), "--policy", policy)
    assert code == 9
    assert any("model.ts missing" in line for line in out)
    assert any(line.startswith("FAIL latency:onnxruntime-fp32") for line in out)


@pytest.mark.parametrize(("error_code", "expected"), [(6, 6), (5, 6), (7, 7)])
def test_failed_build_report(build: Path, capsys: pytest.CaptureFixture[str], error_code: int, expected: int) -> None:
    def fail(report: dict[str, Any]) -> None:
        report["status"] = "failed"
        report["error"] = {"kind": "x", "exit_code": error_code, "message": "[export] it broke"}

    _edit_report(build, fail)
    (build / "manifest.json").unlink()  # failed builds publish no manifest
    code, out, _ = _gate(capsys, str(build))
    assert code == expected
    assert out[0] == "FAIL build: [export] it broke"


def test_policy_minimum_cosine_exits_7(build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def loosen(report: dict[str, Any]) -> None:  # rows the build's own tolerance passed, the policy's does not
        for cand in report["parity"]["candidates"]:
            for row in cand["checks"]:
                if row.get("cosine") is not None:
                    row["cosine"] = 0.99995

    _edit_report(build, loosen)
    policy = _policy(tmp_path, "[gate]\nmin_cosine = { fp32 = 0.99999 }\n")  # a minimum above 1 is a config error
    code, out, err = _gate(capsys, str(build), "--policy", policy)
    assert code == 7
    assert {line.split(":")[0] + ":" + line.split(":")[1] for line in out} == {
        "FAIL parity:torchscript",
        "FAIL parity:onnxruntime-fp32",
    }
    assert all("< gate minimum 0.99999 for fp32" in line for line in out)
    assert err.startswith("deploy: parity failure: release gate failed:")


def test_non_finite_values_in_report_exit_7(build: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def poison(report: dict[str, Any]) -> None:
        row = report["parity"]["candidates"][1]["checks"][0]
        row["nan"] = 3

    _edit_report(build, poison)
    code, out, _ = _gate(capsys, str(build))
    assert code == 7
    assert len(out) == 1 and "non-finite output: 3 NaN/Inf values > 0 allowed" in out[0]


def test_required_backend_that_was_skipped_exits_7(
    build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = _policy(tmp_path, 'required_backends = ["tensorrt"]\n')
    code, out, _ = _gate(capsys, str(build), "--policy", policy)
    assert code == 7
    assert out == ["FAIL required:tensorrt: required backend tensorrt: no TensorRT"]


def test_latency_regression_against_baseline_exits_8(
    build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = json.loads((build / "report.json").read_text())
    assert _gate(capsys, str(build), "--baseline", str(build / "report.json"))[0] == 0  # same numbers: +0%
    for row in baseline["latency"]["backends"].values():
        row["p90_ms"] /= 2.0
    (tmp_path / "old.json").write_text(json.dumps(baseline))
    policy = _policy(tmp_path, 'latency_metric = "p90"\nmax_latency_regression_pct = 50\n')
    code, out, err = _gate(capsys, str(build), "--policy", policy, "--baseline", str(tmp_path / "old.json"))
    assert code == 8
    # the artifact that ships, not the by-products beside it (torchscript was timed too, and regressed as much)
    assert [line.split(": p90")[0] for line in out] == ["FAIL regression:onnxruntime-fp32"]
    assert "torchscript" in baseline["latency"]["backends"]
    assert all("(+100.0%, allowed +50%)" in line for line in out)
    assert err.startswith("deploy: performance regression: release gate failed: regression:")


def test_a_regression_compares_the_deployed_artifacts_and_refuses_an_untimed_baseline(
    build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = json.loads((build / "report.json").read_text())
    for cand in baseline["parity"]["candidates"]:  # a baseline that deployed another backend (FP32 before INT8)
        if cand.get("deploy"):
            cand["name"] = "onnxruntime-old"
    baseline["latency"]["backends"]["onnxruntime-old"] = baseline["latency"]["backends"].pop("onnxruntime-fp32")
    (tmp_path / "old.json").write_text(json.dumps(baseline))
    code, out, _ = _gate(capsys, str(build), "--baseline", str(tmp_path / "old.json"))
    assert code == 0
    result = run_gate(build / "report.json", baseline_path=tmp_path / "old.json")
    (line,) = [c.line() for c in result.checks if c.id.startswith("regression:")]
    assert line.startswith("ok   regression:onnxruntime-fp32:") and line.endswith("(baseline onnxruntime-old)")
    del baseline["latency"]["backends"]["onnxruntime-old"]  # its deployed backend untimed: nothing to compare
    (tmp_path / "old.json").write_text(json.dumps(baseline))
    code, _, err = _gate(capsys, str(build), "--baseline", str(tmp_path / "old.json"))
    assert code == 3 and "baseline: no latency of onnxruntime-old, the backend it deployed" in err


def test_baseline_named_in_policy_is_read_relative_to_it(
    build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = json.loads((build / "report.json").read_text())
    for row in baseline["latency"]["backends"].values():
        row["p50_ms"] /= 10.0
    (tmp_path / "old.json").write_text(json.dumps(baseline))
    code, out, _ = _gate(capsys, str(build), "--policy", _policy(tmp_path, 'baseline = "old.json"\n'))
    assert code == 8 and len(out) == 1 and out[0].startswith("FAIL regression:onnxruntime-fp32")


def test_bad_policy_and_missing_report(build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _gate(capsys, str(build), "--policy", _policy(tmp_path, "min_cosin = { fp32 = 0.9 }\n"))
    assert code == 2 and "unknown key 'min_cosin'" in err and "did you mean 'min_cosine'" in err
    code, _, err = _gate(capsys, str(build), "--policy", _policy(tmp_path, 'required_checks = ["speed"]\n'))
    assert code == 2 and "required_checks[0]" in err
    code, _, err = _gate(capsys, str(tmp_path / "nowhere" / "report.json"))
    assert code == 3 and "report not found" in err


def test_build_runs_the_gate_before_publishing(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gated"
    strict = _policy(tmp_path, '[gate]\nrequired_backends = ["tensorrt"]\n')  # a cpu build has no engine
    code = main(["build", "--config", str(project), "--out", str(out), "--policy", strict])
    _, err = capsys.readouterr()
    assert code == 7
    assert "gate FAIL required:tensorrt" in err
    assert not (out / "manifest.json").exists()  # nothing published
    failed = json.loads((out / ".last-failed" / "report.json").read_text())
    assert failed["stages"][-1]["name"] == "gate" and failed["stages"][-1]["status"] == "failed"
    assert failed["metrics"]["gate"]["status"] == "failed" and failed["error"]["exit_code"] == 7

    (project.parent / "gate.toml").write_text("[gate]\nmax_latency_regression_pct = 1000\n")
    code = main(["build", "--config", str(project), "--out", str(out), "--policy", str(project.parent / "gate.toml")])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["metrics"]["gate"]["status"] == "passed"
    assert main(["gate", str(out)]) == 0


def test_a_baseline_with_no_deployed_artifact_fails_the_regression_check_saying_why(
    build: Path, tmp_path: Path
) -> None:
    baseline = json.loads((build / "report.json").read_text())
    for cand in baseline["parity"]["candidates"]:
        cand["deploy"] = False  # e.g. a report whose deployed backend was skipped
    (tmp_path / "old.json").write_text(json.dumps(baseline))
    result = run_gate(build / "report.json", baseline_path=tmp_path / "old.json")
    (check,) = [c for c in result.checks if c.id.startswith("regression")]
    assert (
        not check.passed
        and check.message == "no backend to compare: a report names no deployed artifact (deploy: true)"
    )


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: r["model"].__setitem__("artifact", ["model.onnx"]),  # unhashable: a dict lookup raised
        lambda r: r["model"].__setitem__("artifact", 5),
        lambda r: r.__setitem__("model", "model.onnx"),
    ],
    ids=["artifact-list", "artifact-int", "model-string"],
)
def test_a_report_whose_model_record_has_the_wrong_types_fails_binding_in_one_line(
    build: Path, edit: Callable[[dict[str, Any]], None], capsys: pytest.CaptureFixture[str]
) -> None:
    """An edited report.json (its manifest hash updated to match) whose model record is of the wrong type: the
    binding check fails (exit 9) with one line, as for any other mismatch, not a traceback."""
    _edit_report(build, edit)
    code, out, err = _gate(capsys, str(build))
    assert code == 9 and "Traceback" not in err
    assert any("binding" in line for line in out + err.splitlines())


def test_a_latency_budget_with_no_timing_of_the_deployed_artifact_fails(
    build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``max_latency_ms`` never passes in silence: an untimed deployed artifact fails the budget, saying why."""
    policy = _policy(tmp_path, "max_latency_ms = 1000\n")
    assert _gate(capsys, str(build), "--policy", policy)[0] == 0  # timed and within the budget

    def untimed(report: dict[str, Any]) -> None:
        report["latency"] = {"status": "skipped", "reason": "validate.latency_iters = 0"}

    _edit_report(build, untimed)
    code, out, _ = _gate(capsys, str(build), "--policy", policy)
    assert code == 8
    assert any(
        line.startswith("FAIL latency:onnxruntime-fp32: no p50 timing of onnxruntime-fp32 to hold to the 1000")
        and line.endswith("validate.latency_iters = 0")
        for line in out
    ), out


def test_a_regression_against_a_baseline_timed_at_another_shape_fails_as_not_comparable(
    build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = json.loads((build / "report.json").read_text())
    for row in baseline["latency"]["backends"].values():
        row["shape"] = {name: [16, *dims[1:]] for name, dims in row["shape"].items()}  # a batch of 16, as slow
        row["p50_ms"] *= 16
    (tmp_path / "old.json").write_text(json.dumps(baseline))
    code, out, _ = _gate(capsys, str(build), "--baseline", str(tmp_path / "old.json"))
    assert code == 8
    assert any(line.startswith("FAIL regression:onnxruntime-fp32:") and "not comparable" in line for line in out), out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[gate]\nmax_nonfinite = 0\n[extra]\nx = 1\n", "a [gate] table and other keys or tables (extra) beside it"),
        ('baseline = ""\n', "'baseline' = '' names no report"),
    ],
)
def test_a_policy_that_would_judge_less_than_it_reads_is_a_config_error(
    build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    code, _, err = _gate(capsys, str(build), "--policy", _policy(tmp_path, text))
    assert code == 2 and message in err, err


def test_a_gate_on_a_folder_whose_later_build_failed_says_which_release_it_judged(
    build: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (build / ".last-failed").mkdir()
    os.utime(build / "report.json", (1_000_000_000, 1_000_000_000))
    code, out, err = _gate(capsys, str(build))
    assert code == 0 and "a later build into" in err and "the previous release it kept" in err
