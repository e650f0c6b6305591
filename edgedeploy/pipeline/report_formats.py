"""Report formats beside report.json: JUnit XML for CI, a Markdown summary, an HTML page with plots.

``write_all(report, folder)`` writes them all and returns their file names (the runner adds them to
the manifest). Plots (error histogram per output, latency per backend) are drawn with matplotlib's
object API (no pyplot, no global backend change) and inlined as SVG; without matplotlib the HTML
page says so and keeps its tables.
"""

from __future__ import annotations

import html
import io
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

    ``plot_cache``: where rendered SVG plots are kept by content hash (authenticated memos), so a
    cached rebuild does not pay for matplotlib again.
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


def markdown(report: dict[str, Any]) -> str:
    """A Markdown summary: status, stages, worst parity row per backend and output, localization, latency."""
    lines = [
        f"# edgedeploy report: {str(report.get('status', '?')).upper()}",
        "",
        f"target `{report.get('target')}` ({report.get('runtime')}), precision `{report.get('precision')}`, "
        f"{report.get('seconds', 0):.1f} s",
        "",
    ]
    if report.get("error"):
        lines += [f"**Error** ({report['error'].get('kind')}): {report['error'].get('message')}", ""]
    lines += ["## Stages", "", "| stage | status | seconds | note |", "|---|---|---:|---|"]
    for st in report.get("stages", []):
        note = str(st.get("reason", "")).replace("|", "\\|")
        lines.append(f"| {st['name']} | {st['status']} | {st.get('seconds', 0):.2f} | {note} |")
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
                note = f"{cand.get('status')}: {cand.get('reason', '')}"
                lines.append(f"| {cand['name']} | - | - | - | - | - | - | - | - | - | {note} |")
            for row in _worst_rows(cand):
                result = (
                    ("vacuous" if row.get("vacuous") else "ok")
                    if row.get("passed")
                    else "**FAIL**: " + str(row.get("reason", "")).replace("|", "\\|")
                )
                lines.append(
                    f"| {cand['name']} | {row.get('check')} | {row.get('output')} | {where(row)}"
                    f" | {_num(row.get('max_abs'))} | {_num(row.get('p99_abs'))} | "
                    f"{_num(row.get('max_rel'))} | {_num(row.get('cosine'), 6)} | {_num(row.get('top1_agreement'))} | "
                    f"{row.get('nan', 0)}/{row.get('inf', 0)} | {result} |"
                )
        for cand in _candidates(report):
            if cand.get("localization"):
                lines += ["", f"**{cand['name']}**: {_localization_text(cand['localization'])}"]
    lines += ["", "## Latency (opt shape)", ""]
    lat = report.get("latency") or {}
    if lat.get("backends"):
        lines += ["| backend | p50 ms | p90 ms | p99 ms | samples/s | batch |", "|---|---:|---:|---:|---:|---:|"]
        for name, row in lat["backends"].items():
            lines.append(
                f"| {name} | {row['p50_ms']:.3f} | {row['p90_ms']:.3f} | {row['p99_ms']:.3f} | "
                f"{row['throughput']:.1f} | {row.get('batch', '-')} |"
            )
    for name, reason in (lat.get("skipped") or {}).items():
        lines.append(f"- {name}: skipped: {reason}")
    if lat.get("status") == "skipped":
        lines.append(f"skipped: {lat.get('reason', '')}")
    gate = (report.get("metrics") or {}).get("gate")
    if gate:
        lines += ["", f"## Release gate: {gate['status']}", ""]
        lines += [f"- {'ok' if c['passed'] else '**FAIL**'} `{c['id']}`: {c['message']}" for c in gate["checks"]]
    if report.get("warnings"):
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in report["warnings"]]
    return "\n".join(lines) + "\n"


# ---- HTML ----------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
h1 .passed{color:#1a7f37}h1 .failed{color:#cf222e}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
th{background:#f3f3f3}td.num{text-align:right;font-family:monospace}tr.fail td{background:#ffebe9}
.box{border-left:4px solid #cf222e;background:#fff5f5;padding:.5em 1em;margin:1em 0}
figure.plot{display:inline-block;margin:0 1em 1em 0}figure.plot svg{width:520px;height:auto}
figcaption{font-size:12px;color:#555}
"""


def html_page(report: dict[str, Any], plot_cache: TextMemo | None = None) -> str:
    """A self-contained HTML page: tables plus inline SVG plots (error histograms, latency bars)."""
    e = html.escape
    status = str(report.get("status", "?"))
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>edgedeploy report</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>edgedeploy report: <span class='{e(status)}'>{e(status.upper())}</span></h1>",
        f"<p>target <b>{e(str(report.get('target')))}</b> ({e(str(report.get('runtime')))}), precision "
        f"<b>{e(str(report.get('precision')))}</b>, {report.get('seconds', 0):.1f} s</p>",
    ]
    if report.get("error"):
        parts.append(f"<div class='box'><b>{e(str(report['error'].get('kind')))}</b>: ")
        parts.append(f"{e(str(report['error'].get('message')))}</div>")
    for cand in _candidates(report):
        if cand.get("localization"):
            parts.append(f"<div class='box'><b>{e(cand['name'])}</b>: {e(_localization_text(cand['localization']))}")
            parts.append("</div>")
    parts.append("<h2>Stages</h2><table><tr><th>stage</th><th>status</th><th>seconds</th><th>note</th></tr>")
    for st in report.get("stages", []):
        cls = " class='fail'" if st.get("status") == "failed" else ""
        parts.append(
            f"<tr{cls}><td>{e(st['name'])}</td><td>{e(st['status'])}</td>"
            f"<td class='num'>{st.get('seconds', 0):.2f}</td><td>{e(str(st.get('reason', '')))}</td></tr>"
        )
    parts.append("</table><h2>Parity against PyTorch</h2>")
    parts.append(_parity_table(report))
    parts.append("<h2>Latency (opt shape)</h2>")
    parts.append(_latency_table(report))
    parts.append("<h2>Plots</h2>")
    parts += _cached_plots(report, plot_cache)
    gate = (report.get("metrics") or {}).get("gate")
    if gate:
        parts.append(f"<h2>Release gate: {e(gate['status'])}</h2><ul>")
        parts += [
            f"<li>{'ok' if c['passed'] else '<b>FAIL</b>'} {e(c['id'])}: {e(c['message'])}</li>" for c in gate["checks"]
        ]
        parts.append("</ul>")
    if report.get("warnings"):
        parts.append("<h2>Warnings</h2><ul>" + "".join(f"<li>{e(w)}</li>" for w in report["warnings"]) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _parity_table(report: dict[str, Any]) -> str:
    e = html.escape
    parity = report.get("parity") or {}
    if not _candidates(report):
        return f"<p>{e(str(parity.get('status', 'skipped')))}: {e(str(parity.get('reason', '')))}</p>"
    head = ["backend", "check", "output", "worst at", "max abs", "p99 abs", "max rel", "cosine", "top-1", "NaN/Inf"]
    rows = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "<th>result</th></tr>"]
    for cand in _candidates(report):
        if not cand.get("checks"):
            cls = " class=fail" if cand.get("status") == "failed" else ""
            reason = e(str(cand.get("reason", "")))
            rows.append(
                f"<tr{cls}><td>{e(cand['name'])}</td><td colspan='{len(head) - 1}'>{reason}</td>"
                f"<td>{e(cand.get('status', ''))}</td></tr>"
            )
        for row in _worst_rows(cand):
            ok = row.get("passed", False)
            cells = [
                e(cand["name"]),
                e(str(row.get("check"))),
                e(str(row.get("output"))),
                e(where(row)),
            ]
            nums = [row.get(k) for k in ("max_abs", "p99_abs", "max_rel")] + [row.get("cosine")]
            figures = [_num(n) for n in nums[:3]] + [_num(nums[3], 6), _num(row.get("top1_agreement"))]
            figures.append(f"{row.get('nan', 0)}/{row.get('inf', 0)}")
            result = "ok" if ok else "FAIL: " + e(str(row.get("reason", "")))
            rows.append(
                f"<tr{'' if ok else ' class=fail'}>"
                + "".join(f"<td>{c}</td>" for c in cells)
                + "".join(f"<td class='num'>{f}</td>" for f in figures)
                + f"<td>{result}</td></tr>"
            )
    return "\n".join(rows) + "</table>"


def _latency_table(report: dict[str, Any]) -> str:
    e = html.escape
    lat = report.get("latency") or {}
    out = []
    if lat.get("backends"):
        out.append("<table><tr><th>backend</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>samples/s</th></tr>")
        for name, row in lat["backends"].items():
            out.append(
                f"<tr><td>{e(name)}</td>"
                + "".join(f"<td class='num'>{row[k]:.3f}</td>" for k in ("p50_ms", "p90_ms", "p99_ms"))
                + f"<td class='num'>{row['throughput']:.1f}</td></tr>"
            )
        out.append("</table>")
    for name, reason in (lat.get("skipped") or {}).items():
        out.append(f"<p>{e(name)}: skipped: {e(str(reason))}</p>")
    if lat.get("status") == "skipped":
        out.append(f"<p>skipped: {e(str(lat.get('reason', '')))}</p>")
    return "\n".join(out)


def _cached_plots(report: dict[str, Any], plot_cache: TextMemo | None) -> list[str]:
    """``_plots`` memoised on disk by the sha256 of everything the plots are drawn from."""
    if plot_cache is None:
        return _plots(report)
    from edgedeploy.fileio.hashing import sha256_json

    key = sha256_json(
        {
            "v": 1,
            "hist": [(c.get("name"), c.get("histograms")) for c in _candidates(report)],
            "latency": (report.get("latency") or {}).get("backends"),
        }  # fmt: skip
    )
    memo = plot_cache.read_memo(key)
    if memo is not None:
        return [memo]
    parts = _plots(report)
    plot_cache.write_memo(key, "\n".join(parts))
    return ["\n".join(parts)]


def _plots(report: dict[str, Any]) -> list[str]:
    try:
        from matplotlib.figure import Figure  # noqa: F401  (optional: the 'report' extra)
    except ImportError:
        return ["<p>plots need matplotlib: pip install 'edgedeploy[report]'</p>"]
    parts = []
    outputs: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for cand in _candidates(report):
        for out_name, hist in (cand.get("histograms") or {}).items():
            outputs.setdefault(out_name, []).append((cand["name"], hist))
    for out_name, hists in outputs.items():
        svg = _histogram_svg(out_name, hists)
        parts.append(_figure(f"histogram:{out_name}", svg, f"absolute error vs PyTorch, output '{out_name}'"))
    backends = (report.get("latency") or {}).get("backends") or {}
    if backends:
        parts.append(_figure("latency", _latency_svg(backends), "latency at the opt shape per backend"))
    if not parts:
        parts.append("<p>no plots: parity and latency did not run</p>")
    return parts


def _figure(key: str, svg: str, caption: str) -> str:
    return (
        f"<figure class='plot' data-plot='{html.escape(key)}'>{svg}"
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _svg(fig: Any) -> str:
    from matplotlib import rc_context

    buf = io.StringIO()
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "edgedeploy"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _histogram_svg(output: str, hists: list[tuple[str, dict[str, Any]]]) -> str:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.4))
    ax = fig.subplots()
    for name, hist in hists:
        edges = hist["edges"]
        counts = list(hist["counts"])
        total = sum(counts) + hist.get("exact", 0)
        label = f"{name} ({hist.get('exact', 0)} exact of {total}"
        label += f", {hist['non_finite']} NaN/Inf)" if hist.get("non_finite") else ")"
        ax.stairs(counts, edges, label=label, linewidth=1.5)
    ax.set_xlabel("log10 |candidate - PyTorch|")
    ax.set_ylabel("values")
    ax.set_title(f"error histogram: {output}")
    ax.legend(fontsize=8)
    return _svg(fig)


def _latency_svg(backends: dict[str, dict[str, Any]]) -> str:
    from matplotlib.figure import Figure

    names = list(backends)
    fig = Figure(figsize=(6.4, 0.6 + 0.45 * len(names) + 1.2))
    ax = fig.subplots()
    y = list(range(len(names)))
    ax.barh(y, [backends[n]["p50_ms"] for n in names], color="#4c72b0", label="p50")
    ax.scatter([backends[n]["p90_ms"] for n in names], y, marker="|", s=200, color="#dd8452", label="p90", zorder=3)
    ax.scatter([backends[n]["p99_ms"] for n in names], y, marker="|", s=200, color="#c44e52", label="p99", zorder=3)
    ax.set_yticks(y, names)
    ax.set_xlabel("milliseconds per batch")
    ax.set_title("latency")
    ax.legend(fontsize=8)
    return _svg(fig)
