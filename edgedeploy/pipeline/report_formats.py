"""Report formats beside report.json: JUnit XML for CI, a Markdown summary, an HTML page with plots.

``write_all(report, folder)`` writes them all and returns their file names (the runner adds them to
the manifest). Plots (error histogram per output, latency per backend, the INT8 search, calibration
ranges) are drawn as inline SVG by :mod:`edgedeploy.pipeline.svg_plots`.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Protocol

from edgedeploy.fileio.store import atomic_write_text
from edgedeploy.validate.parity import where

JUNIT = "report.junit.xml"
MARKDOWN = "report.md"
HTML = "report.html"


class TextMemo(Protocol):
    """Where rendered plots are kept by content hash (the stage cache: authenticated, see pipeline.cache)."""

    def read_memo(self, name: str) -> str | None: ...

    def write_memo(self, name: str, text: str) -> None: ...


def write_all(report: dict[str, Any], folder: Path, plot_cache: TextMemo | None = None) -> list[str]:
    """Write report.junit.xml, report.md and report.html into ``folder``; return their names.

    ``plot_cache``: where rendered SVG plots are kept by content hash (authenticated memos), so a cached rebuild
    does not draw them again.
    """
    atomic_write_text(folder / JUNIT, junit_xml(report))
    atomic_write_text(folder / MARKDOWN, markdown(report))
    atomic_write_text(folder / HTML, html_page(report, plot_cache))
    return [JUNIT, MARKDOWN, HTML]


# ---- shared views ----------------------------------------------------------------------------------------


def _candidates(report: dict[str, Any]) -> list[dict[str, Any]]:
    return list((report.get("parity") or {}).get("candidates") or [])


def _check_name(row: dict[str, Any]) -> str:
    return f"{row.get('check', 'parity')} {where(row)} {row.get('output')}"


def _num(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}e}" if abs(v) < 1e-2 and v != 0 else f"{v:.{digits + 1}g}"
    return str(v)


def _worst_rows(cand: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (check, output): the row with the largest max abs error (failing rows first)."""
    worst: dict[tuple[str, str], dict[str, Any]] = {}
    for row in cand.get("checks", []):
        key = (row.get("check", "parity"), row.get("output", "?"))
        old = worst.get(key)
        rank = (not row.get("passed", False), row.get("max_abs") or 0.0)
        if old is None or rank > (not old.get("passed", False), old.get("max_abs") or 0.0):
            worst[key] = row
    return list(worst.values())


# ---- JUnit ---------------------------------------------------------------------------------------------


def junit_xml(report: dict[str, Any]) -> str:
    """JUnit XML: one test suite per group (stages, each backend's parity, latency, gate), one test case per check."""
    root = ET.Element("testsuites", name="edgedeploy")
    stages = _suite(root, "stages")
    for st in report.get("stages", []):
        case = _case(stages, "edgedeploy.stages", st["name"], st.get("seconds", 0.0))
        if st.get("status") == "failed":
            ET.SubElement(case, "failure", message=st.get("reason", "failed"), type="stage failed")
        elif st.get("status") == "skipped":
            ET.SubElement(case, "skipped", message=st.get("reason", "skipped"))
    parity = report.get("parity") or {}
    if not _candidates(report):
        suite = _suite(root, "parity")
        case = _case(suite, "edgedeploy.parity", "parity")
        ET.SubElement(case, "skipped", message=f"{parity.get('status', 'skipped')}: {parity.get('reason', '')}")
    for cand in _candidates(report):
        name = cand.get("name", "?")
        suite = _suite(root, f"parity.{name}")
        cls = f"edgedeploy.parity.{name}"
        if cand.get("status") == "skipped":
            ET.SubElement(_case(suite, cls, "parity"), "skipped", message=f"skipped: {cand.get('reason', '')}")
            continue
        if not cand.get("checks"):
            ET.SubElement(_case(suite, cls, "run"), "failure", message=str(cand.get("reason")), type="cannot run")
        for row in cand.get("checks", []):
            case = _case(suite, cls, _check_name(row))
            if not row.get("passed", False):
                kind = ", ".join(row.get("failure", ["failed"]))
                fail = ET.SubElement(case, "failure", message=str(row.get("reason", "failed")), type=kind)
                fail.text = _row_text(row)
        loc = cand.get("localization")
        if loc:
            out = ET.SubElement(suite, "system-out")
            out.text = _localization_text(loc)
    lat = report.get("latency") or {}
    suite = _suite(root, "latency")
    for name, row in (lat.get("backends") or {}).items():
        case = _case(suite, "edgedeploy.latency", name, row.get("p50_ms", 0.0) / 1e3)
        out = ET.SubElement(case, "system-out")
        out.text = (
            f"p50 {row['p50_ms']:.3f} ms, p90 {row['p90_ms']:.3f} ms, p99 {row['p99_ms']:.3f} ms, "
            f"{row['throughput']:.1f} samples/s"
        )
    for name, reason in (lat.get("skipped") or {}).items():
        ET.SubElement(_case(suite, "edgedeploy.latency", name), "skipped", message=f"skipped: {reason}")
    gate = (report.get("metrics") or {}).get("gate")
    if gate:
        suite = _suite(root, "gate")
        for chk in gate.get("checks", []):
            case = _case(suite, "edgedeploy.gate", chk["id"])
            if not chk["passed"]:
                ET.SubElement(case, "failure", message=chk["message"], type=chk["kind"])
    error = report.get("error")
    if error and not any(st.get("status") == "failed" for st in report.get("stages", [])):
        case = _case(_suite(root, "build"), "edgedeploy.build", "build")
        ET.SubElement(case, "failure", message=error.get("message", ""), type=error.get("kind", "error"))
    _totals(root)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _suite(root: ET.Element, name: str) -> ET.Element:
    return ET.SubElement(root, "testsuite", name=name)


def _case(suite: ET.Element, classname: str, name: str, seconds: float = 0.0) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{float(seconds):.6f}")


def _totals(root: ET.Element) -> None:
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in root.findall("testsuite"):
        cases = suite.findall("testcase")
        counts = {
            "tests": len(cases),
            "failures": sum(1 for c in cases if c.find("failure") is not None),
            "errors": 0,
            "skipped": sum(1 for c in cases if c.find("skipped") is not None),
        }
        seconds = sum(float(c.get("time", "0")) for c in cases)
        for k, v in counts.items():
            suite.set(k, str(v))
            total[k] += v
        suite.set("time", f"{seconds:.6f}")
    for k, v in total.items():
        root.set(k, str(v))


def _row_text(row: dict[str, Any]) -> str:
    keys = ("max_abs", "p99_abs", "max_rel", "p99_rel", "cosine", "top1_agreement", "nan", "inf")
    return ", ".join(f"{k}={row[k]}" for k in keys if k in row)


def _localization_text(loc: dict[str, Any]) -> str:
    from edgedeploy.validate.localize import describe

    return describe(loc)


# ---- Markdown ------------------------------------------------------------------------------------------


_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character (escape sequences, carriage returns, newlines) shown as its
    ``\\x..`` code: names read from a model file reach a terminal or a summary as text, never as commands."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def md(value: Any) -> str:
    """``value`` as literal Markdown text inside a table cell or a line: HTML escaped, Markdown's markup
    characters (``\\ ` * _ [ ] | #``) backslash-escaped, control characters (newlines among them) shown as
    their code. Names come from model files and configs: they must not end a table row or add a link."""
    return _MD_SPECIAL.sub(r"\\\1", printable(html.escape(str(value), quote=False)))


def markdown(report: dict[str, Any]) -> str:
    """A Markdown summary: status, stages, worst parity row per backend and output, localization, latency.

    Every value read from the report is written through :func:`md` (literal text)."""
    lines = [
        f"# edgedeploy report: {md(str(report.get('status', '?')).upper())}",
        "",
        f"target {md(report.get('target'))} ({md(report.get('runtime'))}), precision {md(report.get('precision'))}, "
        f"{report.get('seconds', 0):.1f} s",
        "",
    ]
    if report.get("error"):
        lines += [f"**Error** ({md(report['error'].get('kind'))}): {md(report['error'].get('message'))}", ""]
    lines += ["## Stages", "", "| stage | status | seconds | note |", "|---|---|---:|---|"]
    for st in report.get("stages", []):
        note = md(st.get("reason", ""))
        lines.append(f"| {md(st['name'])} | {md(st['status'])} | {st.get('seconds', 0):.2f} | {note} |")
    lines += ["", "## Parity against PyTorch", ""]
    parity = report.get("parity") or {}
    if not _candidates(report):
        lines.append(f"{parity.get('status', 'skipped')}: {parity.get('reason', '')}")
    else:
        lines += [
            "| backend | check | output | worst at | max abs | p99 abs | max rel | cosine | top-1 | NaN/Inf | result |",
            "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for cand in _candidates(report):
            if not cand.get("checks"):
                note = md(f"{cand.get('status')}: {cand.get('reason', '')}")
                lines.append(f"| {md(cand['name'])} | - | - | - | - | - | - | - | - | - | {note} |")
            for row in _worst_rows(cand):
                result = (
                    ("vacuous" if row.get("vacuous") else "info: " if row.get("informational") else "ok")
                    + (md(row["informational"]) if row.get("informational") else "")
                    if row.get("passed")
                    else "**FAIL**: " + md(row.get("reason", ""))
                )
                lines.append(
                    f"| {md(cand['name'])} | {md(row.get('check'))} | {md(row.get('output'))} | {md(where(row))}"
                    f" | {_num(row.get('max_abs'))} | {_num(row.get('p99_abs'))} | "
                    f"{_num(row.get('max_rel'))} | {_num(row.get('cosine'), 6)} | {_num(row.get('top1_agreement'))} | "
                    f"{row.get('nan', 0)}/{row.get('inf', 0)} | {result} |"
                )
        from edgedeploy.reportview import input_legend

        legend = input_legend([row for cand in _candidates(report) for row in cand.get("checks", [])])
        if legend:
            lines += ["", "Inputs: " + "; ".join(f"{md(label)} {md(text)}" for label, text in legend) + "."]
        if parity.get("cached"):
            lines += ["", "_cached: judged by an earlier build, not in this run._"]
        for cand in _candidates(report):
            if cand.get("localization"):
                lines += ["", f"**{md(cand['name'])}**: {md(_localization_text(cand['localization']))}"]
    lines += ["", "## Latency (opt shape)", ""]
    lat = report.get("latency") or {}
    if lat.get("cached"):
        when = f" {lat['measured_at']}" if lat.get("measured_at") else ""
        lines += [f"_cached: measured{when} by an earlier build, not in this run._", ""]
    if lat.get("backends"):
        lines += ["| backend | p50 ms | p90 ms | p99 ms | samples/s | batch |", "|---|---:|---:|---:|---:|---:|"]
        for name, row in lat["backends"].items():
            lines.append(
                f"| {md(name)} | {row['p50_ms']:.3f} | {row['p90_ms']:.3f} | {row['p99_ms']:.3f} | "
                f"{row['throughput']:.1f} | {row.get('batch', '-')} |"
            )
    for name, reason in (lat.get("skipped") or {}).items():
        lines.append(f"- {md(name)}: skipped: {md(reason)}")
    if lat.get("status") == "skipped":
        lines.append(f"skipped: {md(lat.get('reason', ''))}")
    gate = (report.get("metrics") or {}).get("gate")
    if gate:
        lines += ["", f"## Release gate: {md(gate['status'])}", ""]
        lines += [f"- {'ok' if c['passed'] else '**FAIL**'} {md(c['id'])}: {md(c['message'])}" for c in gate["checks"]]
    if report.get("warnings"):
        lines += ["", "## Warnings", ""] + [f"- {md(w)}" for w in report["warnings"]]
    return "\n".join(lines) + "\n"


# ---- HTML ----------------------------------------------------------------------------------------------

TEMPLATES = Path(__file__).resolve().parent / "templates"
PARITY_HEAD = ("backend", "check", "inputs", "sample", "output", "max abs", "p99 abs", "max rel", "cosine", "top-1",
               "NaN/Inf", "result")  # fmt: skip


def html_page(report: dict[str, Any], plot_cache: TextMemo | None = None) -> str:
    """A self-contained HTML page (templates/report.html.j2, rendered with jinja2, autoescaped): tables, the
    localization, and inline SVG plots: latency on a log axis, the INT8 search, calibration vs declared input
    range, error histograms."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape
    from markupsafe import Markup

    from edgedeploy.reportview import input_legend

    env = Environment(
        loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]), keep_trailing_newline=True
    )
    plots = _cached_plots(report, plot_cache)
    all_rows = [(cand["name"], row) for cand in _candidates(report) for row in cand.get("checks", [])]
    precision = (report.get("metrics") or {}).get("precision") or {}
    stage_status = {st.get("name"): st.get("status") for st in report.get("stages", [])}

    def parity_row(item: tuple[str, dict[str, Any]]) -> Markup:
        name, row = item
        if row.get("_no_checks"):
            cls = " class='fail'" if row.get("status") == "failed" else ""
            return Markup("<tr{}><td>{}</td><td colspan='{}'>{}</td><td>{}</td></tr>").format(
                Markup(cls), name, len(PARITY_HEAD) - 2, row.get("reason", ""), row.get("status", "")
            )
        ok = row.get("passed", False)
        sample = "pooled" if row.get("sample") is None else row.get("sample")
        figures = [_num(row.get(k)) for k in ("max_abs", "p99_abs", "max_rel")]
        figures += [
            _num(row.get("cosine"), 6),
            _num(row.get("top1_agreement")),
            f"{row.get('nan', 0)}/{row.get('inf', 0)}",
        ]
        result = ("vacuous" if row.get("vacuous") else "ok") if ok else "FAIL: " + str(row.get("reason", ""))
        if ok and row.get("informational"):  # a spec-random golden of FP16/INT8: reported, not judged
            result = "info: " + str(row["informational"])
        cells = Markup("").join(
            Markup("<td>{}</td>").format(c)
            for c in (name, row.get("check"), row.get("shape"), sample, row.get("output"))
        )
        nums = Markup("").join(Markup("<td class='num'>{}</td>").format(f) for f in figures)
        return Markup("<tr{}>{}{}<td>{}</td></tr>").format(Markup("" if ok else " class='fail'"), cells, nums, result)

    def plot(key: str) -> Markup:
        if key not in plots:
            return Markup("")
        svg, caption, attrs = plots[key]
        extra = Markup("").join(Markup(" data-{}='{}'").format(k, v) for k, v in attrs.items())
        return Markup("<figure class='plot' data-plot='{}'{}>{}<figcaption>{}</figcaption></figure>").format(
            key, extra, Markup(svg), caption
        )

    worst = []
    for cand in _candidates(report):
        if not cand.get("checks"):
            worst.append(
                (cand["name"], {"_no_checks": True, "status": cand.get("status"), "reason": cand.get("reason")})
            )
        worst += [(cand["name"], row) for row in _worst_rows(cand)]
    tries = search_tries(precision)
    accuracy = precision.get("accuracy") or {}
    float_layers = precision.get("kept_float") or precision.get("fp32_layers") or []
    template = env.get_template("report.html.j2")
    return template.render(
        report=report,
        parity=report.get("parity") or {},
        latency=report.get("latency") or {},
        candidates=_candidates(report),
        localizations=[
            (c["name"], _localization_text(c["localization"])) for c in _candidates(report) if c.get("localization")
        ],
        parity_head=PARITY_HEAD,
        worst_rows=worst,
        all_rows=all_rows,
        legend=input_legend([row for _, row in all_rows]),
        parity_row=parity_row,
        plot=plot,
        histogram_keys=[k for k in plots if k.startswith("histogram:")],
        precision=precision,
        precision_cached=stage_status.get("precision") == "cached",
        tries=tries,
        shipped_try=accuracy.get("try"),
        float_layers=float_layers,
        calib_ranges=precision.get("calibration_range") or {},
        gate=(report.get("metrics") or {}).get("gate"),
    )


Plot = tuple[str, str, dict[str, str]]  # svg, caption, data attributes of its <figure>


def search_tries(precision: dict[str, Any]) -> list[dict[str, Any]]:
    """The precision stage's ``fallback_tries`` in one shape for the page: the CNN search's rows (``float_nodes``,
    ``family``, ``met``, ``vetoed``, ``p50_ms``) and the transformer recipe's (``float_matmuls``, met when its
    score reaches the target) alike."""
    target = (precision.get("accuracy_target") or {}).get("value")
    rows: list[dict[str, Any]] = []
    for t in precision.get("fallback_tries") or []:
        if not isinstance(t, dict) or not isinstance(t.get("score"), (int, float)):
            continue
        met = t.get("met")
        if met is None:
            met = target is not None and t["score"] >= target
        rows.append(
            {
                "try": int(t.get("try", len(rows))),
                "float_nodes": int(t.get("float_nodes", t.get("float_matmuls")) or 0),
                "family": t.get("family", ""),
                "metric": t.get("metric", "score"),
                "score": float(t["score"]),
                "met": bool(met),
                "vetoed": t.get("vetoed", ""),
                "p50_ms": t.get("p50_ms"),
            }
        )
    return rows


def _cached_plots(report: dict[str, Any], plot_cache: TextMemo | None) -> dict[str, Plot]:
    """``_plots`` memoised (authenticated memos of the stage cache) by the sha256 of everything they are drawn from."""
    if plot_cache is None:
        return _plots(report)
    import json

    from edgedeploy.fileio.hashing import sha256_json

    precision = (report.get("metrics") or {}).get("precision") or {}
    key = sha256_json(
        {
            "v": 4,  # bump when a plot is drawn differently
            "hist": [(c.get("name"), c.get("histograms")) for c in _candidates(report)],
            "latency": (report.get("latency") or {}).get("backends"),
            "tries": precision.get("fallback_tries"),
            "accuracy": precision.get("accuracy"),
            "target": precision.get("accuracy_target"),
            "ranges": precision.get("calibration_range"),
        }  # fmt: skip
    )
    memo = plot_cache.read_memo(key)
    if memo is not None:
        try:
            data = json.loads(memo)
            return {k: (v[0], v[1], dict(v[2])) for k, v in data["plots"].items()}
        except (ValueError, KeyError, TypeError, IndexError):  # a damaged memo is drawn again
            pass
    plots = _plots(report)
    plot_cache.write_memo(key, json.dumps({"plots": plots}))
    return plots


def _plots(report: dict[str, Any]) -> dict[str, Plot]:
    """Plot key -> (svg, caption, attributes)."""
    from edgedeploy.pipeline.svg_plots import histogram_svg, latency_svg, ranges_svg, search_svg

    plots: dict[str, Plot] = {}
    outputs: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for cand in _candidates(report):
        for out_name, hist in (cand.get("histograms") or {}).items():
            outputs.setdefault(out_name, []).append((cand["name"], hist))
    backends = (report.get("latency") or {}).get("backends") or {}
    if backends:
        svg, scale = latency_svg(backends)
        caption = "latency per backend at the opt shape: p50 bar, p90 and p99 ticks (log axis)"
        plots["latency"] = (svg, caption, {"xscale": scale})
    precision = (report.get("metrics") or {}).get("precision") or {}
    tries = search_tries(precision)
    if tries:
        target = (precision.get("accuracy_target") or {}).get("value")
        shipped = (precision.get("accuracy") or {}).get("try")
        caption = (
            "INT8 search: held-out agreement per try against the target (filled: meets; hollow: misses or vetoed "
            "by the goldens; star: shipped) and each try's ONNX Runtime p50 (squares, right axis)"
        )
        plots["int8-search"] = (search_svg(tries, target, shipped), caption, {"tries": str(len(tries))})
    ranges = precision.get("calibration_range") or {}
    if ranges:
        caption = "calibration data (min..max, 1st..99th percentile) against the declared inputs.range"
        plots["calibration-range"] = (ranges_svg(ranges), caption, {"inputs": str(len(ranges))})
    for out_name, hists in outputs.items():
        caption = f"absolute error vs PyTorch, output '{out_name}'"
        plots[f"histogram:{out_name}"] = (histogram_svg(out_name, hists), caption, {})
    return plots
