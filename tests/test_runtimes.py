"""Runtime backends are a registry: a toy runtime added in one place is built by the pipeline."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import write_tiny_project

from edgedeploy import runtimes
from edgedeploy import stagenames as names
from edgedeploy.artifacts import deploy_model_name
from edgedeploy.cli import main
from edgedeploy.config import load_config
from edgedeploy.errors import ConfigError, TargetCapabilityError
from edgedeploy.pipeline.runner import run_build
from edgedeploy.stages.base import Stage, StageResult
from edgedeploy.targets import load_target_file


class ToyArtifactFromOnnx(Stage):
    """The toy runtime's artifact: the precision model's bytes, reversed."""

    name = names.BUILD
    produces = ("model.toy",)

    def requires(self, ctx: Any) -> tuple[str, ...]:
        return (deploy_model_name(ctx.precision),)

    def run(self, ctx: Any) -> StageResult:
        data = ctx.path(deploy_model_name(ctx.precision)).read_bytes()
        (ctx.staging / "model.toy").write_bytes(data[::-1])
        return StageResult({"artifact": "model.toy", "bytes": len(data)}, notes=["built by the toy runtime"])


@pytest.fixture
def toy_runtime() -> Iterator[runtimes.RuntimeBackend]:
    backend = runtimes.register(
        runtimes.RuntimeBackend(
            name="toyrt",
            build_stage=f"{__name__}:ToyArtifactFromOnnx",
            preflight="edgedeploy.onnxtools.opsupport:onnxruntime_preflight",
            qdq_flavour="onnxruntime",
            validation_backends=("onnxruntime",),
            probe="edgedeploy.onnxtools.ort:onnxruntime_version",
            builds_here=True,
        )
    )
    yield backend
    runtimes.unregister("toyrt")


def test_a_registered_toy_runtime_is_built_by_the_pipeline(tmp_path: Path, toy_runtime: Any) -> None:
    targets = tmp_path / "targets.toml"
    targets.write_text('[targets.toy-box]\nbase = "cpu"\nruntime = "toyrt"\ndescription = "a toy"\n')
    assert load_target_file(targets)["toy-box"].builds_here
    cfg_path = write_tiny_project(tmp_path / "proj")
    cfg = load_config(cfg_path, {"build.target": "toy-box", "build.targets_file": str(targets)})
    result = run_build(cfg, log=lambda _: None)
    assert result.ok
    toy = (result.out / "model.toy").read_bytes()
    assert toy[::-1] == (result.out / "model.onnx").read_bytes()
    report = json.loads((result.out / "report.json").read_text())
    assert report["runtime"] == "toyrt" and report["metrics"]["build"]["artifact"] == "model.toy"
    assert "built by the toy runtime" in report["notes"]
    # validated by its one registered validation backend: ONNX Runtime, though a TorchScript capture was written
    assert (result.out / "model.ts").is_file()
    candidates = report["parity"]["candidates"]
    assert [c["name"] for c in candidates] == ["onnxruntime-fp32"] and candidates[0]["status"] == "passed"


def no_toy_here() -> None:
    """A probe that finds nothing."""
    return None


def _toy_targets(tmp_path: Path) -> Path:
    targets = tmp_path / "targets.toml"
    targets.write_text('[targets.toy-box]\nbase = "cpu"\nruntime = "toyrt"\ndescription = "a toy"\n')
    return targets


def test_deploy_doctor_shows_the_toy_runtimes_probe_and_judges_by_it(
    tmp_path: Path, toy_runtime: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import onnxruntime

    targets = _toy_targets(tmp_path)
    assert main(["doctor", "--targets-file", str(targets), "--require", "toy-box"]) == 0
    out = capsys.readouterr().out
    version = re.escape(onnxruntime.__version__)
    assert re.search(rf"^  toyrt\s+{version}$", out, re.M), out  # its probe, next to the built-in runtimes
    assert re.search(rf"^toy-box\s+toyrt\s+toyrt {version}: artifact built here$", out, re.M), out
    assert main(["doctor", "--json", "--targets-file", str(targets)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["host"]["runtimes"]["toyrt"] == onnxruntime.__version__
    assert report["targets"]["toy-box"]["artifact_here"] is True

    runtimes.register(dataclasses.replace(toy_runtime, probe=f"{__name__}:no_toy_here"))
    assert main(["doctor", "--targets-file", str(targets), "--require", "toy-box"]) == TargetCapabilityError.exit_code
    captured = capsys.readouterr()
    assert re.search(r"^  toyrt\s+not installed$", captured.out, re.M)
    assert "toy-box: toyrt not installed" in captured.err


def test_deploy_targets_lists_the_toy_runtimes_int8_route(tmp_path: Path, toy_runtime: Any, capsys: Any) -> None:
    runtimes.register(dataclasses.replace(toy_runtime, int8_route="QDQ (toy)"))
    assert main(["targets", "--targets-file", str(_toy_targets(tmp_path))]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("toy-box"))
    assert "toyrt" in row and "QDQ (toy)" in row


def test_an_unregistered_runtime_is_refused_naming_the_file(tmp_path: Path) -> None:
    targets = tmp_path / "targets.toml"
    targets.write_text('[targets.toy-box]\nbase = "cpu"\nruntime = "toyrt"\n')
    with pytest.raises(ConfigError, match="runtime 'toyrt' must be one of onnxruntime, tensorrt"):
        load_target_file(targets)


def _runtime_name_tests(tree: ast.AST) -> list[int]:
    """Lines comparing a ``runtime`` (name or attribute) with a string literal: ``if runtime == "tensorrt"``."""

    def is_runtime(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "runtime") or (
            isinstance(node, ast.Attribute) and node.attr == "runtime"
        )

    def is_literal(node: ast.AST) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(is_literal(e) for e in node.elts)
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(is_runtime(s) for s in sides) and any(is_literal(s) for s in sides):
                lines.append(node.lineno)
    return lines


def test_no_module_branches_on_a_runtime_name() -> None:
    """Everything runtime-specific is looked up in the registry, so a new runtime is one module plus register()."""
    import edgedeploy

    root = Path(edgedeploy.__file__).parent
    found = {
        str(f.relative_to(root)): lines
        for f in sorted(root.rglob("*.py"))
        if f.name != "runtimes.py" and (lines := _runtime_name_tests(ast.parse(f.read_text())))
    }
    assert found == {}
    assert _runtime_name_tests(ast.parse('if t.runtime != "tensorrt":\n    pass\nx = runtime in ("a", "b")')) == [1, 3]
