"""The stage contract: results cached whole, declared inputs required, the gate only where a build validates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_TOML, write_tiny_project

from edgedeploy.cli import main
from edgedeploy.config import load_config
from edgedeploy.errors import InputError, StageInputError
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


class SkippedToy(NoteFromNothing):
    """Writes toy.txt, but not for this build."""

    def applies(self, ctx: Any) -> str | None:
        return "not for this build"


class ReadsToy(Stage):
    """Reads toy.txt (required) and extra.txt (optional), writes their sizes."""

    name = "reader"
    consumes = ("toy.txt",)
    optional = ("extra.txt",)
    produces = ("sizes.txt",)
    runs = 0

    def run(self, ctx: Any) -> dict[str, Any]:
        type(self).runs += 1
        extra = ctx.path("extra.txt")
        sizes = [ctx.path("toy.txt").stat().st_size, extra.stat().st_size if extra.is_file() else -1]
        (ctx.staging / "sizes.txt").write_text(repr(sizes))
        return {"sizes": sizes}


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


def test_a_missing_consumed_file_is_an_error_naming_file_stage_and_fix(tmp_path: Path) -> None:
    cfg = load_config(write_tiny_project(tmp_path / "proj"))
    ReadsToy.runs = 0
    with pytest.raises(StageInputError) as err:
        run_build(cfg, stages=[SkippedToy(), ReadsToy()], log=lambda _: None)
    line = err.value.one_line()
    assert err.value.stage == "reader" and err.value.input == "toy.txt" and err.value.exit_code == 3
    assert "stage reader needs toy.txt" in line and "(toy) was skipped: not for this build" in line
    assert "ReadsToy.optional" in line  # the fix names where to declare it optional
    assert ReadsToy.runs == 0  # refused before the stage ran, not the stage's own error
    assert not (tmp_path / "proj" / "out" / "sizes.txt").exists()


def test_a_consumed_file_no_stage_writes_is_an_error(tmp_path: Path) -> None:
    cfg = load_config(write_tiny_project(tmp_path / "proj"))
    with pytest.raises(StageInputError, match="no earlier stage of this build writes it"):
        run_build(cfg, stages=[ReadsToy()], log=lambda _: None)


def test_an_optional_consumed_file_may_be_absent_and_keys_the_cache_when_present(tmp_path: Path) -> None:
    cfg = load_config(write_tiny_project(tmp_path / "proj"))
    ReadsToy.runs = 0
    result = run_build(cfg, stages=[NoteFromNothing(), ReadsToy()], log=lambda _: None)
    assert (result.out / "sizes.txt").read_text() == "[3, -1]"

    class ExtraToo(NoteFromNothing):
        produces = ("toy.txt", "extra.txt")

        def run(self, ctx: Any) -> dict[str, Any]:
            (ctx.staging / "extra.txt").write_text("extra")
            return super().run(ctx)

    again = run_build(cfg, stages=[ExtraToo(), ReadsToy()], log=lambda _: None)
    assert (again.out / "sizes.txt").read_text() == "[3, 5]" and ReadsToy.runs == 2
