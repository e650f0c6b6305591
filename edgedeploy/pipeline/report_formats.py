"""Report formats beside report.json: JUnit XML for CI, a Markdown summary, an HTML page with plots.

``write_all(report, folder)`` writes them all and returns their file names (the runner adds them to
the manifest). Plots (error histogram per output, latency per backend) are drawn with matplotlib's
object API (no pyplot, no global backend change) and inlined as SVG; without matplotlib the HTML
page says so and keeps its tables.
"""

from __future__ import annotations

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

    ``plot_cache``: where rendered SVG plots are kept by content hash (authenticated memos), so a cached rebuild
    does not pay for matplotlib again.
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
                    ("vacuous" if row.get("vacuous") else "info: " if row.get("informational") else "ok")
                    + (str(row["informational"]).replace("|", "\\|") if row.get("informational") else "")
                    if row.get("passed")
                    else "**FAIL**: " + str(row.get("reason", "")).replace("|", "\\|")
                )
                lines.append(
                    f"| {cand['name']} | {row.get('check')} | {row.get('output')} | {where(row)}"
                    f" | {_num(row.get('max_abs'))} | {_num(row.get('p99_abs'))} | "
                    f"{_num(row.get('max_rel'))} | {_num(row.get('cosine'), 6)} | {_num(row.get('top1_agreement'))} | "
                    f"{row.get('nan', 0)}/{row.get('inf', 0)} | {result} |"
                )
        from edgedeploy.reportview import input_legend

        legend = input_legend([row for cand in _candidates(report) for row in cand.get("checks", [])])
        if legend:
            lines += ["", "Inputs: " + "; ".join(f"`{label}` {text}" for label, text in legend) + "."]
        if parity.get("cached"):
            lines += ["", "_cached: judged by an earlier build, not in this run._"]
        for cand in _candidates(report):
            if cand.get("localization"):
                lines += ["", f"**{cand['name']}**: {_localization_text(cand['localization'])}"]
    lines += ["", "## Latency (opt shape)", ""]
    lat = report.get("latency") or {}
    if lat.get("cached"):
        when = f" {lat['measured_at']}" if lat.get("measured_at") else ""
        lines += [f"_cached: measured{when} by an earlier build, not in this run._", ""]
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
    plots, missing = _cached_plots(report, plot_cache)
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
        plots_missing=missing,
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


def _cached_plots(report: dict[str, Any], plot_cache: TextMemo | None) -> tuple[dict[str, Plot], str]:
    """``_plots`` memoised (authenticated memos of the stage cache) by the sha256 of everything they are drawn from."""
    if plot_cache is None:
        return _plots(report)
    import json

    from edgedeploy.fileio.hashing import sha256_json

    precision = (report.get("metrics") or {}).get("precision") or {}
    key = sha256_json(
        {
            "v": 3,  # bump when a plot is drawn differently
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
            return {k: (v[0], v[1], dict(v[2])) for k, v in data["plots"].items()}, str(data["missing"])
        except (ValueError, KeyError, TypeError, IndexError):  # a damaged memo is drawn again
            pass
    plots, missing = _plots(report)
    plot_cache.write_memo(key, json.dumps({"plots": plots, "missing": missing}))
    return plots, missing


def _plots(report: dict[str, Any]) -> tuple[dict[str, Plot], str]:
    """Plot key -> (svg, caption, attributes), and why plots are missing (empty when drawn)."""
    try:
        from matplotlib.figure import Figure  # noqa: F401  (optional: the 'report' extra)
    except ImportError:
        return {}, "plots skipped: they need matplotlib (pip install 'edgedeploy[report]'); the tables are complete"
    plots: dict[str, Plot] = {}
    outputs: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for cand in _candidates(report):
        for out_name, hist in (cand.get("histograms") or {}).items():
            outputs.setdefault(out_name, []).append((cand["name"], hist))
    backends = (report.get("latency") or {}).get("backends") or {}
    if backends:
        svg, scale = _latency_svg(backends)
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
        plots["int8-search"] = (_search_svg(tries, target, shipped), caption, {"tries": str(len(tries))})
    ranges = precision.get("calibration_range") or {}
    if ranges:
        caption = "calibration data (min..max, 1st..99th percentile) against the declared inputs.range"
        plots["calibration-range"] = (_ranges_svg(ranges), caption, {"inputs": str(len(ranges))})
    for out_name, hists in outputs.items():
        caption = f"absolute error vs PyTorch, output '{out_name}'"
        plots[f"histogram:{out_name}"] = (_histogram_svg(out_name, hists), caption, {})
    return plots, ""


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


def _latency_svg(backends: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """Horizontal p50 bars with p90 / p99 ticks on a log axis (a 2 s p99 beside 0.03 ms bars keeps both
    readable); returns the SVG and the axis scale."""
    from matplotlib.figure import Figure

    names = list(backends)
    fig = Figure(figsize=(6.4, 0.6 + 0.45 * len(names) + 1.2))
    ax = fig.subplots()
    y = list(range(len(names)))
    values = [backends[n][k] for n in names for k in ("p50_ms", "p90_ms", "p99_ms") if backends[n].get(k)]
    floor = min([v for v in values if v > 0] or [1.0]) / 3
    ax.set_xscale("log")
    ax.barh(y, [backends[n]["p50_ms"] - floor for n in names], left=floor, color="#4c72b0", label="p50")
    ax.scatter([backends[n]["p90_ms"] for n in names], y, marker="|", s=200, color="#dd8452", label="p90", zorder=3)
    ax.scatter([backends[n]["p99_ms"] for n in names], y, marker="|", s=200, color="#c44e52", label="p99", zorder=3)
    for i, n in enumerate(names):
        ax.annotate(f"{backends[n]['p50_ms']:.3g} ms", (backends[n]["p50_ms"], i), xytext=(4, -10),
                    textcoords="offset points", fontsize=7)  # fmt: skip
    ax.set_xlim(left=floor)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per batch (log scale)")
    ax.set_title("latency")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: never over a tick
    return _svg(fig), ax.get_xscale()


def _search_svg(tries: list[dict[str, Any]], target: float | None, shipped: int | None) -> str:
    """Agreement per try (left axis, with the target) and each try's p50 (right axis)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    x = [t["try"] + 1 for t in tries]
    met = [t for t in tries if t.get("met")]
    missed = [t for t in tries if not t.get("met")]
    ax.scatter([t["try"] + 1 for t in met], [t["score"] for t in met], color="#1a7f37", label="meets", zorder=3)
    ax.scatter([t["try"] + 1 for t in missed], [t["score"] for t in missed], facecolors="none", edgecolors="#cf222e",
               label="misses / vetoed", zorder=3)  # fmt: skip
    ax.plot(x, [t["score"] for t in tries], color="#999", linewidth=0.8, zorder=2)
    for t in tries:
        label = f"{t['float_nodes']}" + ({"sensitivity": "s", "prefix": "p"}.get(t.get("family", ""), ""))
        ax.annotate(label, (t["try"] + 1, t["score"]), xytext=(0, 6), textcoords="offset points", fontsize=7,
                    ha="center")  # fmt: skip
    if shipped is not None:
        chosen = [t for t in tries if t["try"] == shipped]
        if chosen:
            ax.scatter([shipped + 1], [chosen[0]["score"]], marker="*", s=220, color="#9a6700", label="shipped",
                       zorder=4)  # fmt: skip
    if target is not None:
        ax.axhline(target, color="#cf222e", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel("try (label: float nodes, s = sensitivity, p = prefix family)")
    ax.set_ylabel(str(tries[0].get("metric", "score")))
    ax.set_xticks(x)
    timed = [t for t in tries if t.get("p50_ms")]
    if timed:
        speed = ax.twinx()
        speed.plot([t["try"] + 1 for t in timed], [t["p50_ms"] for t in timed], marker="s", color="#4c72b0",
                   linestyle=":", linewidth=1, markersize=4, label="p50 ms")  # fmt: skip
        speed.set_ylabel("ONNX Runtime p50 ms (right)")
        speed.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("INT8 float-fallback search")
    return _svg(fig)


def _ranges_svg(ranges: dict[str, dict[str, Any]]) -> str:
    """Per input: the declared range (light), the calibration min..max (thin) and 1st..99th percentile (thick)."""
    from matplotlib.figure import Figure

    names = list(ranges)
    fig = Figure(figsize=(6.4, 0.8 + 0.55 * len(names) + 0.9))
    ax = fig.subplots()
    for i, name in enumerate(names):
        r = ranges[name]
        lo, hi = r["declared"]
        ax.barh(i, hi - lo, left=lo, height=0.7, color="#d0e4f5", label="declared inputs.range" if i == 0 else None)
        dlo, dhi = r["data"]
        colour = "#cf222e" if r.get("outside") else "#1f4e79"
        ax.plot([dlo, dhi], [i, i], color=colour, linewidth=2, label="calibration min..max" if i == 0 else None)
        if r.get("data_p1_p99"):
            plo, phi = r["data_p1_p99"]
            ax.plot([plo, phi], [i, i], color=colour, linewidth=7, alpha=0.6,
                    label="calibration 1st..99th pct" if i == 0 else None)  # fmt: skip
    ax.set_yticks(list(range(len(names))), names)
    ax.set_ylim(-0.8, len(names) - 0.2)
    ax.set_xlabel("input value")
    ax.set_title("calibration data vs declared input range")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=3)
    return _svg(fig)
