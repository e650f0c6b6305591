"""Messages of the device and gate commands say what is wrong with the folder given and a fix that applies: a
cpu build has no device bundle (it is not a failed one), a folder holding only a failed run points at that run,
and a failed build's fix is said once."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_unique_tiny_project

from edgedeploy.cli import main


def _line(capsys: pytest.CaptureFixture[str], prefix: str = "deploy") -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith(prefix)]
    assert len(err) == 1, err
    return err[0]


@pytest.fixture(scope="module")
def cpu_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = write_unique_tiny_project(tmp_path_factory.mktemp("device_msgs"))
    out = cfg.parent / "out"
    assert main(["build", "--config", str(cfg), "--out", str(out)]) == 0
    return out


def test_a_cpu_build_given_to_device_run_is_told_it_has_no_bundle(
    cpu_build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    code = main(["device", "run", str(cpu_build), "--host", "ci@127.0.0.1", "--known-hosts", str(known)])
    err = _line(capsys)
    assert code == 3, err
    assert (
        f"{cpu_build}: a build for target 'cpu', whose artifact (model.onnx) runs here: it has no device bundle" in err
    )
    assert "failed" not in err and "--target <a TensorRT target, e.g. jetson-orin>" in err


def test_a_folder_with_only_a_failed_run_points_at_it_and_its_fix_is_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_unique_tiny_project(tmp_path)
    out = tmp_path / "failed"
    assert main(["build", "--config", str(cfg), "--out", str(out), "--set", "gate.max_latency_ms=0.000001"]) == 8
    capsys.readouterr()
    assert main(["gate", str(out)]) == 3
    err = _line(capsys)
    assert f"holds only a failed run -- fix: deploy gate {out / '.last-failed' / 'report.json'} judges that run" in err
    assert main(["gate", str(out / ".last-failed" / "report.json")]) == 6
    err = _line(capsys)
    assert err.count(" -- fix: ") == 1 and "fix the build failure first: speed the artifact up" in err, err


def test_a_missing_engine_names_where_engines_are(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engine", "check", str(tmp_path / "nothere.engine")]) == 3
    assert "fix: give the path of a model.engine that deploy bundle complete or deploy device run wrote" in _line(
        capsys
    )
