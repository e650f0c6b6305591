"""Library chatter goes to OUT/build.log with a count on the stage line; verbose lets it through."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_capture import make_config

from edgedeploy.pipeline.runner import run_build
from edgedeploy.stages.reference import GoldensFromTorch

NOISY = """
import warnings

import torch
from torch import nn


class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        print("converter: folding constants")
        warnings.warn("some library notice", UserWarning)
        return self.fc(x)


def build():
    torch.manual_seed(0)
    return Noisy()
"""


def _cfg(tmp_path: Path):
    return make_config(
        tmp_path, NOISY, inputs=[{"name": "x", "shape": ["batch", 3]}], dims={"batch": {"min": 1, "opt": 2, "max": 3}}
    )


def test_library_output_goes_to_build_log_with_a_count(tmp_path: Path, capsys) -> None:
    lines: list[str] = []
    result = run_build(_cfg(tmp_path), stages=[GoldensFromTorch()], log=lines.append)
    out, err = capsys.readouterr()
    assert "folding constants" not in out + err and "library notice" not in out + err
    stage_line = next(line for line in lines if "reference" in line)
    assert "library messages in build.log" in stage_line
    log = (result.out / "build.log").read_text()
    assert "[reference] converter: folding constants" in log
    assert "UserWarning" in log and "some library notice" in log


@pytest.mark.filterwarnings("ignore:some library notice")
def test_verbose_shows_library_output(tmp_path: Path, capsys) -> None:
    lines: list[str] = []
    result = run_build(_cfg(tmp_path), stages=[GoldensFromTorch()], log=lines.append, verbose=True)
    out, _ = capsys.readouterr()
    assert "folding constants" in out
    assert not (result.out / "build.log").exists()
