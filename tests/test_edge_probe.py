"""Capture and export also probe the inputs' range edges (zeros, both ends, pairs of them), where random draws
never land: ``atan2`` exports with another answer at ``(0, -1)`` and passed on random inputs alone."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.cli import main
from edgedeploy.config import InputSpec
from edgedeploy.modelio.generators import EDGE_PATTERNS, edge_values
from edgedeploy.onnxtools.shapes import EDGE_POINT, ProbePoint, compare_shapes

ANGLE = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Angle(nn.Module):
        def forward(self, v):
            return torch.atan2(v[:, 1], v[:, 0])


    def build():
        return Angle()
    """
)


def test_an_op_wrong_at_its_range_edges_fails_export_naming_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"angle_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(ANGLE)
    (tmp_path / "deploy.toml").write_text(
        f'outputs = ["angle"]\n[model]\nfactory = "{name}:build"\n'
        '[[inputs]]\nname = "v"\nshape = ["batch", 2]\nrange = [-1.0, 1.0]\n'
        "[dims.batch]\nmin = 1\nopt = 4\nmax = 9\n[validate]\nsamples = 1\nlatency_iters = 1\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["build", "-c", str(tmp_path / "deploy.toml"), "--out", str(tmp_path / "out")]) == 6
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("deploy: ")]
    assert len(err) == 1
    assert "computes other values than PyTorch where its inputs sit at their range's edges" in err[0]
    assert f"at {EDGE_POINT}: output 'angle' differs from PyTorch" in err[0]
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_edge_rows_cover_zeros_both_ends_and_each_pair() -> None:
    spec = InputSpec("v", ("batch", 2), range=(-1.0, 2.0))
    rows = edge_values(spec, (len(EDGE_PATTERNS), 2), np.random.default_rng(0))
    assert rows.dtype == np.float32 and rows.min() == -1.0 and rows.max() == 2.0
    pairs = {(float(a), float(b)) for a, b in rows}
    assert pairs == {(x, y) for x in (-1.0, 0.0, 2.0) for y in (-1.0, 0.0, 2.0)}
    above = InputSpec("ids", ("batch", 4), dtype="int64", range=(3, 9))
    ids = edge_values(above, (3, 4), np.random.default_rng(0))
    assert ids[0].tolist() == [3, 3, 3, 3] and ids[1].tolist() == [9] * 4  # 0 is out of range: the low end
    mask = InputSpec("mask", ("batch", 5), dtype="int64", range=(0, 1), kind="mask")
    assert edge_values(mask, (4, 5), np.random.default_rng(0)).sum(1).min() >= 1  # masks stay valid masks


def test_nan_where_pytorch_gives_nan_is_the_same_answer_and_nan_alone_is_not() -> None:
    point = ProbePoint("opt", {})
    ref = {"y": np.array([np.nan, 1.0, np.inf], np.float32)}

    def same(_feed: dict) -> dict:
        return {"y": np.array([np.nan, 1.0, np.inf], np.float32)}

    def nan_alone(_feed: dict) -> dict:
        return {"y": np.array([np.nan, np.nan, np.inf], np.float32)}

    def other_infinity(_feed: dict) -> dict:
        return {"y": np.array([np.nan, 1.0, -np.inf], np.float32)}

    assert compare_shapes([point], [{}], same, [ref], atol=1e-4)[0] == []
    for candidate in (nan_alone, other_infinity):
        problems, _ = compare_shapes([point], [{}], candidate, [ref], atol=1e-4)
        assert problems and "(NaN or infinity where PyTorch differs)" in problems[0]


RANKED = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Ranked(nn.Module):
        def forward(self, x):
            return torch.topk(x, 3, dim=1).indices


    def build():
        return Ranked()
    """
)


def test_ties_at_the_edges_fail_and_the_probe_can_be_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A constant row ties every score: PyTorch and ONNX Runtime rank ties in other orders. The failure names the
    way out for a model whose answer there is arbitrary, and that way builds."""
    name = f"ranked_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(RANKED)
    monkeypatch.chdir(tmp_path)
    argv = ["build", "--factory", f"{name}:build", "--input", "x:batchx8", "--dim", "batch=1:2:4", "--output", "i",
            "--samples", "1", "--latency-iters", "1", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 6
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("deploy: ")][0]
    assert f"at {EDGE_POINT}: output 'i' differs" in err and "set export.edge_probe = false (--no-edge-probe)" in err
    assert main([*argv, "--no-edge-probe"]) == 0
