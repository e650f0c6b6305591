"""report.html of a real INT8 build (a tiny CNN whose outlier channel makes the float-fallback search run):
latency on a log axis, the INT8 search plot, float layers and why, calibration vs declared range; cached
figures marked as cached; rendered by headless Chromium (skipped where it is absent) and checked painted."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_precision_build import outlier_int8_project

import edgedeploy
from edgedeploy.pipeline.report import results_table

# one xdist worker runs this module, so its module-scoped build runs once (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_report_html")


@pytest.fixture(scope="module")
def int8_build(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An INT8 cpu build whose naive model misses the target (so the search tries), then the same build again
    (every stage restored from the cache)."""
    root = tmp_path_factory.mktemp("int8report")
    proj = outlier_int8_project(
        root,
        validate='latency_iters = 5\nclassifier_outputs = ["logits"]\n',
        sections='[export]\nexporter = "torchscript"\n',
    )
    first = edgedeploy.build(proj / "deploy.toml", log=lambda _: None)
    first_html = (first.out / "report.html").read_text()
    again = edgedeploy.build(proj / "deploy.toml", log=lambda _: None)
    return {"first": first.report, "first_html": first_html, "again": again.report, "out": again.out}


class _Page(HTMLParser):
    """Figures (data-plot -> attributes and the tags inside), and the rows of each table by id."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, dict[str, Any]] = {}
        self.tables: dict[str, int] = {}
        self._plot: str | None = None
        self._table: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "figure" and a.get("data-plot"):
            self._plot = str(a["data-plot"])
            self.plots[self._plot] = {"attrs": a, "tags": set()}
        elif self._plot is not None:
            self.plots[self._plot]["tags"].add(tag)
        if tag == "table" and a.get("id"):
            self._table = str(a["id"])
            self.tables[self._table] = 0
        elif tag == "tr" and self._table is not None:
            self.tables[self._table] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._plot = None
        elif tag == "table":
            self._table = None


def test_int8_report_has_the_search_float_layers_calibration_range_and_log_latency(int8_build: dict) -> None:
    page = _Page()
    page.feed(int8_build["first_html"])
    assert set(page.plots) == {"latency", "int8-search", "calibration-range", "histogram:logits"}
    for plot in page.plots.values():
        assert {"svg", "path"} <= plot["tags"]  # drawn inline, no script, no download
    assert page.plots["latency"]["attrs"]["data-xscale"] == "log"
    precision = int8_build["first"]["metrics"]["precision"]
    tries = precision["fallback_tries"]
    assert len(tries) > 1 and not tries[0]["met"] and precision["accuracy"]["met"]  # the search ran, and passed
    assert page.plots["int8-search"]["attrs"]["data-tries"] == str(len(tries))
    assert page.tables["int8-tries"] == len(tries) + 1  # one row per try, and the header
    assert page.tables["float-layers"] == len(precision["kept_float"]) + 1
    assert page.tables["calibration-range"] == 2  # the one float input
    assert page.tables["parity-all"] == 1 + sum(len(c["checks"]) for c in int8_build["first"]["parity"]["candidates"])
    text = int8_build["first_html"]
    assert "INT8 sensitive: " in text  # why each layer stayed float
    assert "batch consistency: opt sample 0 repeated into a batch of 4" in text  # the legend explains x4
    assert "cached" not in text.split("<h2>Parity")[1].split("<h2>Error")[0]


def test_a_cached_rebuild_marks_its_figures_as_cached(int8_build: dict) -> None:
    first, again = int8_build["first"], int8_build["again"]
    assert all(s["status"] == "cached" for s in again["stages"])
    assert "cached" not in first["latency"] and again["latency"]["cached"] is True
    assert again["parity"]["cached"] is True
    assert again["latency"]["measured_at"] == first["latency"]["measured_at"]  # when they were measured, kept
    table = results_table(again)
    assert f"latency (cached: measured {first['latency']['measured_at']} by an earlier build" in table
    page = (int8_build["out"] / "report.html").read_text()
    assert f"cached: measured {first['latency']['measured_at']} by an earlier build" in page
    summary = (int8_build["out"] / "report.md").read_text()
    assert f"_cached: measured {first['latency']['measured_at']} by an earlier build, not in this run._" in summary


def test_the_plots_need_no_plotting_package_and_escape_the_names_they_draw(int8_build: dict) -> None:
    """The page draws its plots with matplotlib blocked, and a backend or output name with markup in it is text
    in the SVG, not an element."""
    report = json.loads(json.dumps(int8_build["first"]))
    backends = report["latency"]["backends"]
    backends["<script>alert(1)</script>"] = dict(next(iter(backends.values())))
    script = textwrap.dedent(
        """
        import json, sys
        sys.modules["matplotlib"] = None
        from edgedeploy.pipeline.report_formats import html_page
        print(html_page(json.load(sys.stdin)))
        """
    )
    res = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(report),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    page = _Page()
    page.feed(res.stdout)
    assert set(page.plots) == {"latency", "int8-search", "calibration-range", "histogram:logits"}
    assert all({"svg", "path"} <= p["tags"] for p in page.plots.values())
    assert "<script>" not in res.stdout and "&lt;script&gt;alert(1)&lt;/script&gt;" in res.stdout
    latency = res.stdout.split("data-plot='latency'")[1].split("</figure>")[0]
    assert latency.count("ms</text>") == len(report["latency"]["backends"])  # one p50 label per backend


# colours the plots paint (pipeline/svg_plots.py): latency p50 bars, the search's "meets" dots, the declared-range band
PLOT_COLOURS = {"latency bars": "#4c72b0", "search: meets": "#1a7f37", "declared range": "#d0e4f5"}


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (Debian package chromium)")
def test_chromium_renders_the_int8_report_with_its_plots(int8_build: dict, tmp_path: Path) -> None:
    from matplotlib.image import imread

    page = (int8_build["out"] / "report.html").resolve()
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(
        [*base, "--dump-dom", page.as_uri()], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    parsed = _Page()
    parsed.feed(dom)  # the DOM the browser built, not the file: every plot made it in as SVG
    assert {"latency", "int8-search", "calibration-range"} <= set(parsed.plots)
    assert all("svg" in p["tags"] for p in parsed.plots.values())
    png = tmp_path / "report.png"
    subprocess.run(
        [*base, f"--screenshot={png}", "--window-size=1200,3200", page.as_uri()],
        check=True,
        capture_output=True,
        timeout=120,
    )
    pixels = (imread(str(png))[..., :3] * 255).round().astype(np.int16)
    assert pixels.shape[:2] == (3200, 1200)
    flat = pixels.reshape(-1, 3)
    assert len(np.unique(flat, axis=0)) > 50  # text, tables and plots, not a blank page
    for what, colour in PLOT_COLOURS.items():
        rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
        painted = int((np.abs(flat - rgb).max(axis=1) <= 6).sum())
        assert painted > 30, f"{what} ({colour}) not painted: {painted} pixels"


def test_the_transformer_recipe_tries_plot_too() -> None:
    """The transformer INT8 recipe's rows count float MatMuls and carry no verdict: met = score >= target."""
    from edgedeploy.pipeline.report_formats import html_page

    tries = [
        {"try": 0, "float_matmuls": 0, "metric": "cosine", "score": 0.97, "samples": 8},
        {"try": 1, "float_matmuls": 2, "metric": "cosine", "score": 0.995, "samples": 8},
    ]
    precision = {"fallback_tries": tries, "accuracy_target": {"value": 0.99, "why": "default"}, "accuracy": tries[1]}
    report = {"schema": "edgedeploy-report/1", "status": "passed", "precision": "int8", "stages": [],
              "metrics": {"precision": precision}}  # fmt: skip
    page = _Page()
    page.feed(html_page(report))
    assert page.plots["int8-search"]["attrs"]["data-tries"] == "2"
    assert page.tables["int8-tries"] == 3
