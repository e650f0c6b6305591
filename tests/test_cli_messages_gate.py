"""``deploy gate``'s fix names what applies to the failing checks: a device step or a policy for checks that did
not run, the latency budget for a budget missed without a baseline."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_unique_tiny_project

from edgedeploy.cli import main

# one xdist worker runs this module, so each module-scoped build runs once
pytestmark = pytest.mark.xdist_group("test_cli_messages_gate")


@pytest.fixture(scope="module")
def cpu_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = write_unique_tiny_project(tmp_path_factory.mktemp("gate_cpu"))
    out = cfg.parent / "out"
    assert main(["build", "--config", str(cfg), "--target", "cpu", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def orin_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = write_unique_tiny_project(tmp_path_factory.mktemp("gate_orin"))
    out = cfg.parent / "orin"
    argv = ["build", "--config", str(cfg), "--target", "jetson-orin", "--precision", "fp16", "--out", str(out)]
    assert main(argv) == 0
    return out


def _gate_fix(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["gate", *args])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and " -- fix: " in err, err
    return code, err.split(" -- fix: ", 1)[1].strip()


def _policy(tmp_path: Path, text: str) -> str:
    path = tmp_path / "gate.toml"
    path.write_text(text)
    return str(path)


def test_a_device_bundle_gated_before_its_device_step_is_told_to_run_it(
    orin_build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, fix = _gate_fix(capsys, str(orin_build))
    assert code == 7
    assert "[tolerance]" not in fix and "fix the model" not in fix
    assert f"deploy device run {orin_build} --host jetson-orin=user@device" in fix
    assert f"deploy bundle complete {orin_build / 'bundle'}" in fix
    assert 'required_checks = ["integrity"]' in fix
    # the policy the fix names passes the host stages
    assert main(["gate", str(orin_build), "--policy", _policy(tmp_path, 'required_checks = ["integrity"]\n')]) == 0


def test_a_required_backend_that_did_not_run_names_the_ones_that_ran(
    cpu_build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, fix = _gate_fix(capsys, str(cpu_build), "--policy", _policy(tmp_path, 'required_backends = ["tensorrt"]\n'))
    assert code == 7
    assert "[tolerance]" not in fix and "device run" not in fix
    assert fix.startswith("tensorrt did not run in this build")
    assert 'required_backends = ["torchscript", "onnxruntime-fp32"]' in fix


def test_a_parity_failure_that_ran_keeps_the_tolerance_fix(
    cpu_build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, fix = _gate_fix(capsys, str(cpu_build), "--policy", _policy(tmp_path, "min_cosine = { fp32 = 1.0 }\n"))
    assert code == 7
    assert "[tolerance]" in fix and "device run" not in fix


def test_a_missed_latency_budget_without_a_baseline_names_the_budget(
    cpu_build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, fix = _gate_fix(capsys, str(cpu_build), "--policy", _policy(tmp_path, "max_latency_ms = 0.000001\n"))
    assert code == 8
    assert "baseline" not in fix
    assert "max_latency_ms" in fix and "speed the artifact up" in fix
