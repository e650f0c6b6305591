"""A [dims.*] table no input names is refused before any stage runs, naming the closest dim: a mistyped
``--dim bach=1:4:8`` left a given ONNX model validated at batch 1 only, and the build passed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import write_matmul_onnx

from edgedeploy.cli import main


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("deploy: ")]
    assert len(err) == 1
    return err[0]


def test_a_mistyped_dim_for_a_given_onnx_model_is_refused_and_its_fix_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(tmp_path / "cache"))
    write_matmul_onnx(tmp_path / "given.onnx")
    base = ["build", "--onnx", str(tmp_path / "given.onnx"), "--samples", "1", "--latency-iters", "1"]
    assert main([*base, "--dim", "bach=1:4:8", "--out", str(tmp_path / "typo")]) == 2
    err = _one_line(capsys)
    assert "key 'dims.bach' sizes a dim no input names (the inputs' dims: batch)" in err
    assert err.endswith("(--dim batch=1:4:8)") and not (tmp_path / "typo").exists()
    assert main([*base, "--dim", "batch=1:4:8", "--out", str(tmp_path / "fixed")]) == 0  # the fix, as written
    goldens = np.load(tmp_path / "fixed" / "goldens.npz")
    assert goldens["max/0/in/x"].shape == (8, 8)  # validated at the max size asked for


def test_a_dim_typo_beside_the_right_one_and_a_missing_one_name_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    flags = ["build", "--factory", "m:build", "--input", "x:batchx8", "--output", "y", "--out", str(tmp_path / "o")]
    assert main([*flags, "--dim", "batch=1:2:4", "--dim", "bach=1:2:3"]) == 2
    assert "key 'dims.bach' sizes a dim no input names (the inputs' dims: batch)" in _one_line(capsys)
    assert main([*flags, "--dim", "bach=1:2:3"]) == 2
    err = _one_line(capsys)
    assert "names dynamic dim 'batch' and no --dim gives its sizes (--dim bach is given: a typo?)" in err
    assert err.endswith("fix: rename --dim bach=... to --dim batch=...")
