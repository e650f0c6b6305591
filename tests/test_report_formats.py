"""report.json schema, JUnit XML, Markdown and HTML (with plots) for a passing and a failing build."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TINY_TOML, write_tiny_project

from edgedeploy.errors import ParityError

# one xdist worker runs this module, so its module-scoped build fixture runs once (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_report_formats")

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Report folders of a real passing build and of a failing one (one Conv weight edited in model.onnx)."""
    import onnx
    from onnx import numpy_helper

    from edgedeploy.config import load_config
    from edgedeploy.pipeline.report import build_report, write_report_files
    from edgedeploy.pipeline.runner import run_build
    from edgedeploy.stages.base import BuildContext
    from edgedeploy.stages.validate import ParityFromGoldens
    from edgedeploy.targets import get_target

    folder = tmp_path_factory.mktemp("reports")
    name = f"tinynet_{uuid.uuid4().hex[:8]}"
    path = write_tiny_project(folder / "proj", toml=TINY_TOML.replace("tinynet:build", f"{name}:build"))
    (folder / "proj" / "tinynet.py").rename(folder / "proj" / f"{name}.py")
    cfg = load_config(path)
    result = run_build(cfg, log=lambda _: None)

    staging = folder / "staging"
    shutil.copytree(result.out, staging, ignore=shutil.ignore_patterns(".cache"))
    model = onnx.load(str(staging / "model.onnx"))
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    init = next(i for i in model.graph.initializer if i.name == conv.input[1])
    weight = numpy_helper.to_array(init) * np.float32(1.5)
    init.CopyFrom(numpy_helper.from_array(weight, init.name))
    onnx.save(model, str(staging / "model.onnx"))
    ctx = BuildContext(
        cfg=cfg,
        target=get_target("cpu"),
        staging=staging,
        out=staging,
        external={"checkpoint": cfg.path("tiny.safetensors")},
    )
    with pytest.raises(ParityError) as err:
        ParityFromGoldens().run(ctx)
    stages = [dict(s) for s in result.report["stages"][:-1]]
    stages.append({"name": "validate", "status": "failed", "seconds": 1.0, "reason": err.value.one_line()})
    failed = build_report(
        cfg=cfg,
        target=get_target("cpu"),
        stages=stages,
        metrics={**ctx.metrics, "validate": err.value.partial.metrics},
        warnings=[],
        status="failed",
        seconds=1.0,
        error={"kind": err.value.kind, "exit_code": err.value.exit_code, "message": err.value.one_line()},
    )
    out = folder / "failed"
    out.mkdir()
    names = write_report_files(failed, out)
    assert names == ["report.json", "report.junit.xml", "report.md", "report.html"]
    return {"passed": result.out, "failed": out}


def _report(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "report.json").read_text())


def test_reports_match_the_json_schema(reports: dict[str, Path]) -> None:
    import jsonschema

    schema = json.loads((DOCS / "report.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    for folder in reports.values():
        jsonschema.validate(_report(folder), schema)
    broken = _report(reports["passed"])
    broken["parity"]["candidates"][0]["checks"][0]["failure"] = ["made-up reason"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_build_publishes_every_format_in_the_manifest(reports: dict[str, Path]) -> None:
    from edgedeploy.pipeline.manifest import read_manifest, verify_artifacts

    artifacts = verify_artifacts(reports["passed"])
    for name in ("report.json", "report.junit.xml", "report.md", "report.html"):
        assert name in artifacts
    assert read_manifest(reports["passed"]) is not None


def test_junit_has_one_case_per_check_and_parses(reports: dict[str, Path]) -> None:
    from junitparser import Failure, JUnitXml, Skipped

    for kind, folder in reports.items():
        report = _report(folder)
        xml = JUnitXml.fromfile(str(folder / "report.junit.xml"))
        cases = {(suite.name, case.name): case for suite in xml for case in suite}
        checks = [(c["name"], row) for c in report["parity"]["candidates"] for row in c["checks"]]
        for cand, row in checks:
            name = f"{row['check']} {row['shape']}#{row['sample']} {row['output']}"
            case = cases[(f"parity.{cand}", name)]
            failed = any(isinstance(r, Failure) for r in case.result)
            assert failed == (not row["passed"]), (kind, cand, name)
        assert any(isinstance(r, Skipped) for r in cases[("parity.tensorrt", "parity")].result)
        assert {n for s, n in cases if s == "stages"} == {s["name"] for s in report["stages"]}
        assert {n for s, n in cases if s == "latency"} == {"torchscript", "onnxruntime-fp32", "tensorrt"}
        root = ET.parse(folder / "report.junit.xml").getroot()
        assert int(root.get("tests")) == len(root.findall(".//testcase"))
        assert int(root.get("failures")) == len(root.findall(".//testcase/failure"))
        assert (int(root.get("failures")) > 0) == (kind == "failed")


class _Plots(HTMLParser):
    """Collects figure.plot elements and whether each holds an <svg> or <img>."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, set[str]] = {}
        self._current: str | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "figure" and a.get("class") == "plot":
            self._current = a.get("data-plot") or "?"
            self.plots[self._current] = set()
        elif self._current and tag in ("svg", "img", "path"):
            self.plots[self._current].add(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._current = None

    def handle_data(self, data: str) -> None:
        if self._current is None:
            self.text.append(data)


def test_html_has_a_drawn_plot_per_output_and_for_latency(reports: dict[str, Path]) -> None:
    for kind, folder in reports.items():
        parser = _Plots()
        parser.feed((folder / "report.html").read_text())
        assert set(parser.plots) == {"histogram:logits", "latency"}, kind
        for tags in parser.plots.values():
            assert {"svg", "path"} <= tags  # an inline SVG with drawn paths
    failed = _Plots()
    failed.feed((reports["failed"] / "report.html").read_text())
    text = " ".join(failed.text)
    assert "FAILED" in text and "first divergence at ONNX node" in text
    assert "PyTorch module 'conv'" in text


def test_markdown_summary(reports: dict[str, Path]) -> None:
    md = (reports["failed"] / "report.md").read_text()
    assert md.startswith("# edgedeploy report: FAILED")
    assert "| onnxruntime-fp32 | parity | logits |" in md and "**FAIL**: outside tolerance" in md
    assert "| tensorrt | - |" in md and "skipped: no TensorRT" in md
    assert "**onnxruntime-fp32**: first divergence at ONNX node" in md
    passed = (reports["passed"] / "report.md").read_text()
    assert "FAIL" not in passed and "| onnxruntime-fp32 | " in passed.split("## Latency")[1]


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed")
def test_html_renders_in_a_headless_browser(reports: dict[str, Path], tmp_path: Path) -> None:
    from matplotlib.image import imread

    png = tmp_path / "report.png"
    page = (reports["failed"] / "report.html").resolve().as_uri()
    subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={png}",
            "--window-size=1000,1400",
            page,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    pixels = imread(str(png))
    assert pixels.shape[:2] == (1400, 1000)
    colours = len(np.unique(pixels.reshape(-1, pixels.shape[-1])[:, :3], axis=0))
    assert colours > 50  # text, tables and plots, not a blank page


def test_names_from_a_model_file_stay_literal_in_report_md_and_the_console(tmp_path: Path) -> None:
    """An ONNX output name with a table break, HTML, a heading and a link, and terminal escape sequences: the
    Markdown summary keeps it inside its cell as text, and the printed results table shows the escapes as
    codes, so a model file cannot add a link to a CI comment or rewrite the build's own lines."""
    import onnx
    from onnx import TensorProto, helper

    from edgedeploy.cli import main

    evil = "y|<img src=x onerror=alert(1)>\n\n# PWNED [click](https://evil.example)\x1b[2K\rPASSED: fake|"
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], [evil])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info(evil, TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    out = tmp_path / "out"
    code = main(["build", "--onnx", str(tmp_path / "m.onnx"), "--target", "cpu", "--out", str(out)])
    assert code == 0
    text = (out / "report.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| onnxruntime-fp32 | parity |")]
    assert rows and all(line.count(" | ") == 10 for line in rows)  # still 11 cells: the name broke no row
    assert "<img" not in text and "\n# PWNED" not in text and "[click](" not in text  # no tag, heading, link
    assert "&lt;img src=x onerror=alert(1)&gt;" in text and "\\[click\\]" in text
    from edgedeploy.pipeline.report import results_table

    table = results_table(json.loads((out / "report.json").read_text()))
    assert "\x1b" not in table and "\r" not in table and "\\x1b[2K\\x0dPASSED: fake" in table
