"""The stage contract: results cached whole, declared inputs required, the gate only where a build validates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_TOML, write_tiny_project

from edgedeploy.cli import main
from edgedeploy.config import load_config
from edgedeploy.errors import InputError
from edgedeploy.pipeline.runner import run_build
from edgedeploy.stages.base import Stage


class NoteFromNothing(Stage):
    """A toy stage: writes one file and warns once."""

    name = "toy"
    produces = ("toy.txt",)

    def run(self, ctx: Any) -> dict[str, Any]:
        (ctx.staging / "toy.txt").write_text("toy")
        ctx.warn("toy: something to look at")
        return {"made": 1}


class NeedsCalibration(NoteFromNothing):
    def inputs(self, ctx: Any) -> tuple[str, ...]:
        return ("calibration",)


def test_warnings_survive_a_cache_hit(tmp_path: Path) -> None:
    cfg = load_config(write_tiny_project(tmp_path / "proj"))
    first = run_build(cfg, stages=[NoteFromNothing()], log=lambda _: None)
    second = run_build(cfg, stages=[NoteFromNothing()], log=lambda _: None)
    assert [s.status for s in second.stages] == ["cached"]
    assert first.report["warnings"] == second.report["warnings"] == ["toy: something to look at"]
    assert not second.ok  # passed, but nothing was validated against PyTorch


def test_a_missing_declared_input_is_an_error(tmp_path: Path) -> None:
    cfg = load_config(write_tiny_project(tmp_path / "proj"))  # fp32: no calibration configured
    with pytest.raises(InputError, match="needs input 'calibration'"):
        run_build(cfg, stages=[NeedsCalibration()], log=lambda _: None)


def test_check_on_a_config_with_a_gate_table_checks_and_does_not_gate(tmp_path: Path) -> None:
    toml = TINY_TOML + "\n[gate]\nmin_cosine = { fp32 = 0.99 }\n"
    cfg = write_tiny_project(tmp_path / "proj", toml=toml)
    assert main(["check", "--config", str(cfg), "--json"]) == 0
