"""An unusable cache folder is a warning -q still shows, with the fix its cause needs; pruning a folder that
does not exist says so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgedeploy.cli import main


def _build_err(tiny_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["-q", "build", "-c", str(tiny_project), "--target", "cpu", "--out", str(tmp_path / "out")]) == 0
    return capsys.readouterr().err


def test_a_cache_folder_others_may_write_is_a_warning_under_q_with_chmod_as_the_fix(
    tiny_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(shared))
    err = _build_err(tiny_project, tmp_path, capsys)
    lines = [ln for ln in err.splitlines() if "stage cache not used" in ln]
    assert lines == [
        f"warning: stage cache not used: cache folder {shared} is writable by group or others (mode 777); "
        f"every stage runs -- fix: chmod 700 {shared}"
    ], err
    os.chmod(shared, 0o700)  # the fix it names makes the folder the cache
    assert "stage cache not used" not in _build_err(tiny_project, tmp_path, capsys)


def test_a_linked_cache_folder_set_in_the_environment_is_told_to_point_elsewhere(
    tiny_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(link))
    err = _build_err(tiny_project, tmp_path, capsys)
    assert (
        f"warning: stage cache not used: cache folder {link} is a link; every stage runs -- fix: point "
        "EDGEDEPLOY_CACHE_DIR at another folder of yours that is not a link (mkdir -m 700 DIR)"
    ) in err.splitlines(), err


@pytest.mark.parametrize("flag", ["--dir", "--out"])
def test_pruning_a_folder_that_does_not_exist_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    missing = tmp_path / "no-such-cache"
    code = main(["cache", "prune", flag, str(missing)])
    out, err = capsys.readouterr()
    assert code == 3 and out == ""
    where = missing if flag == "--dir" else missing / ".cache"
    assert err.startswith(f"deploy: input error: cache folder not found: {where} ({flag}) -- fix: check the path")
    assert not missing.exists()


def test_pruning_a_cache_dir_from_the_environment_that_does_not_exist_is_an_input_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(tmp_path / "typo"))
    assert main(["cache", "prune"]) == 3
    assert "cache folder not found" in capsys.readouterr().err
