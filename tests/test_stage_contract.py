"""The stage contract: results cached whole, declared inputs required, the gate only where a build validates."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_TOML, write_tiny_project

from edgedeploy.cli import main
from edgedeploy.config import load_config
from edgedeploy.errors import InputError, StageError, StageInputError
from edgedeploy.pipeline.runner import run_build
from edgedeploy.stages.base import Stage, StageResult, partial_result


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
    assert line.startswith("missing stage input: [reader] needs toy.txt")
    assert "(toy) was skipped: not for this build" in line
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


def test_a_real_stage_warning_is_shown_again_and_in_report_json_on_a_fully_cached_rebuild(tmp_path: Path) -> None:
    from edgedeploy.stages.export import OnnxFromTorch

    # weights above the 1 KiB inline limit (the fixture's checkpoint is for 4 channels: the factory's own weights)
    toml = TINY_TOML.replace("channels = 4", "channels = 64").replace('checkpoint = "tiny.safetensors"', "")
    cfg = load_config(write_tiny_project(tmp_path / "proj", toml=toml))
    wanted = "export: onnxslim simplification skipped (model uses external data)"
    for status in ("ran", "cached"):
        lines: list[str] = []
        result = run_build(cfg, stages=[OnnxFromTorch(external_data_threshold=0)], log=lines.append)
        assert [s.status for s in result.stages] == [status]
        assert f"  warning: {wanted}" in lines  # shown on the console, cache hit or not
        assert json.loads((result.out / "report.json").read_text())["warnings"].count(wanted) == 1


class WarnsThenFails(Stage):
    name = "toy"

    def run(self, ctx: Any) -> StageResult:
        result = StageResult()
        with partial_result(result):
            result.warnings.append("toy: looked odd before failing")
            raise StageError("toy", "broke")


def test_warnings_a_stage_returns_before_failing_reach_the_failure_report(tmp_path: Path) -> None:
    cfg = load_config(write_tiny_project(tmp_path / "proj"))
    with pytest.raises(StageError):
        run_build(cfg, stages=[WarnsThenFails()], log=lambda _: None)
    report = json.loads((tmp_path / "proj" / "out" / ".last-failed" / "report.json").read_text())
    assert "toy: looked odd before failing" in report["warnings"] and report["status"] == "failed"


def _side_channels(tree: ast.AST) -> list[str]:
    """``ctx.warn(...)``, ``ctx.warnings...`` and writes into ``ctx.metrics`` in one module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ctx":
            if node.attr in ("warn", "warnings"):
                found.append(f"line {node.lineno}: ctx.{node.attr}")
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and "ctx.metrics" in ast.unparse(t.value):
                    found.append(f"line {node.lineno}: {ast.unparse(t)} =")
    return found


def test_stages_return_warnings_and_metrics_instead_of_writing_the_context() -> None:
    import edgedeploy.stages as pkg

    folder = Path(pkg.__file__).parent
    offenders = {
        f.name: hits
        for f in sorted(folder.glob("*.py"))
        if f.name != "base.py" and (hits := _side_channels(ast.parse(f.read_text())))
    }
    assert offenders == {}
    # the check itself finds what it looks for
    assert sorted(_side_channels(ast.parse("ctx.warn('x')\nctx.metrics['a'] = 1"))) == [
        "line 1: ctx.warn",
        "line 2: ctx.metrics['a'] =",
    ]
