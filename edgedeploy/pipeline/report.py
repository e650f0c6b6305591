"""report.json (schema in README) and the human summary printed at the end of a build."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgedeploy import stagenames as names
from edgedeploy.artifacts import REPORT
from edgedeploy.config import DeployConfig
from edgedeploy.fileio.store import atomic_write_json
from edgedeploy.reportview import CheckRow, ReportView, input_legend
from edgedeploy.sidecar import origin_text
from edgedeploy.targets import TargetProfile

if TYPE_CHECKING:
    from edgedeploy.pipeline.report_formats import TextMemo

SCHEMA = "edgedeploy-report/1"


def build_report(
    *,
    cfg: DeployConfig,
    target: TargetProfile,
    stages: list[dict[str, Any]],
    metrics: dict[str, dict[str, Any]],
    warnings: list[str],
    status: str,
    seconds: float,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the report from stage records and metrics (plain data, JSON-able)."""
    validate = metrics.get(names.VALIDATE, {})
    skipped = next(
        (s.get("reason") for s in stages if s.get("name") == names.VALIDATE and s.get("status") == "skipped"), ""
    )
    not_run = {"status": "skipped", "reason": skipped or "validate stage did not run"}
    cached = any(s.get("name") == names.VALIDATE and s.get("status") == "cached" for s in stages)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "status": status,
        "target": target.name,
        "runtime": target.runtime,
        "precision": cfg.precision.mode,
        "seconds": round(seconds, 3),
        "stages": stages,
        "parity": validate.get("parity", not_run),
        "latency": validate.get("latency", not_run),
        "metrics": {k: v for k, v in metrics.items() if k != names.VALIDATE},
        "warnings": list(warnings),
        "summary": summarize(validate),
        "notes": [n for m in metrics.values() if isinstance(m, dict) for n in m.get("notes") or []],
    }
    sources = data_sources(cfg)
    if sources:
        report["data_sources"] = sources
        exported = [f"{role}: {text}" for role, text in sources.items() if text.startswith("written by ")]
        report["notes"] = exported + report["notes"]  # printed under the verdict: data nobody passed by hand
    if cached:  # restored from the stage cache: figures of an earlier run, marked so no one reads them as new
        for key in ("parity", "latency"):
            report[key] = {**report[key], "cached": True}
    if error:
        report["error"] = error
    return report


def data_sources(cfg: DeployConfig) -> dict[str, str]:
    """Where the build's calibration (INT8) and validation data came from, in words: the samples an exporter
    wrote next to the checkpoint (``written by export_for_deploy (lightning) at PATH``) or the config key."""
    out: dict[str, str] = {}
    p = cfg.precision
    if p.mode == "int8" and (p.calib or p.calib_callable):
        origin = cfg.data_origins.get("precision.calib")
        if origin:
            out["calibration"] = origin_text(origin)
        elif p.calib:
            out["calibration"] = f"precision.calib at {cfg.path(p.calib)}"
        else:
            out["calibration"] = f"precision.calib_callable {p.calib_callable}"
    if cfg.validate.data:
        origin = cfg.data_origins.get("validate.data")
        out["validation"] = origin_text(origin) if origin else f"validate.data at {cfg.path(cfg.validate.data)}"
    return out


def summarize(validate: dict[str, Any]) -> dict[str, Any]:
    """Compact per-backend, per-shape, per-output max-abs-error view for the manifest and the table."""
    parity = validate.get("parity") or {}
    out: dict[str, Any] = {"parity_status": parity.get("status", "skipped")}
    rows: dict[str, Any] = {}
    for cand in parity.get("candidates", []):
        for check in cand.get("checks", []):
            key, value = f"{cand['name']}@{check['shape']}:{check['output']}", check.get("max_abs")
            if rows.get(key) is None or (value is not None and value > rows[key]):  # the largest of a shape's samples
                rows[key] = value
    out["max_abs_error"] = rows
    return out


def write_report_files(report: dict[str, Any], folder: Path, plot_cache: TextMemo | None = None) -> list[str]:
    """Write report.json, report.junit.xml, report.md and report.html into ``folder``; return their names."""
    from edgedeploy.pipeline import report_formats

    atomic_write_json(folder / REPORT, report)
    return [REPORT, *report_formats.write_all(report, folder, plot_cache)]


def results_table(report: ReportView | Mapping[str, Any]) -> str:
    """Plain-text table of every parity check (one row per check and sample), its legend, and the latency lines.

    Raises:
        InputError: ``report`` does not read as an edgedeploy report (the key is named).
    """
    view = report if isinstance(report, ReportView) else ReportView.parse(report)
    lines = []
    parity, lat = view.parity, view.latency
    if not parity.candidates and lat.status == "skipped":
        # bundle-only builds: one line, not an empty table
        same = (lat.reason or "") == (parity.reason or "")
        tail = "" if same else f"; latency: skipped ({lat.reason or ''})"
        return f"parity and latency: {parity.status} ({parity.reason or ''}){tail}"
    rows = [c for cand in parity.candidates for c in cand.checks]
    width = max([len(c.shape or "") for c in rows] + [6])
    header = (
        f"{'backend':<16} {'inputs':<{width}} {'sample':>6}  {'output':<14} {'max_abs':>10} {'p99_abs':>10} "
        f"{'cosine':>9} {'top-1':>6}  result"
    )
    cached = _cached_note(view)
    if cached:
        lines.append(f"parity and latency {cached}")
    lines.append(header)
    lines.append("-" * len(header))
    for cand in parity.candidates:
        if not cand.checks:  # skipped (no TensorRT) or could not run
            lines.append(f"{cand.name:<16} {cand.status}: {cand.reason or ''}")
        for c in cand.checks:
            sample = "pooled" if c.sample is None else str(c.sample)
            top1 = "-" if c.top1_agreement is None else f"{c.top1_agreement:.4f}"
            lines.append(
                f"{cand.name:<16} {c.shape or '-':<{width}} {sample:>6}  {c.output:<14} {_f(c.max_abs):>10} "
                f"{_f(c.p99_abs):>10} {_f(c.cosine, 6):>9} {top1:>6}  {_verdict(c)}"
            )
    if not parity.candidates:
        lines.append(f"parity: {parity.status} ({parity.reason or ''})")
    legend = input_legend(rows)
    if legend:
        lines += ["", "inputs:", *(f"  {label:<14} {text}" for label, text in legend)]
    if lat.backends:
        first = next(iter(lat.backends.values()))
        title = f"latency{_shape_text(first.shape)}"
        width = max([len(title)] + [len(n) for n in lat.backends])
        lines += ["", f"{title:<{width}} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'samples/s':>11}"]
        for name, row in lat.backends.items():
            p50, p90, p99 = (_ms(row.value(k)) for k in ("p50_ms", "p90_ms", "p99_ms"))
            throughput = "-" if row.throughput is None else f"{row.throughput:.1f}"
            lines.append(f"{name:<{width}} {p50:>9} {p90:>9} {p99:>9} {throughput:>11}")
        lines.append("samples/s: timed batches x batch size / their summed time (slow runs count, unlike p50)")
        if cached:
            lines.append(f"latency {cached}")
    if lat.status == "skipped":
        lines.append(f"latency: skipped ({lat.reason or ''})")
    from edgedeploy.pipeline.report_formats import printable

    return "\n".join(printable(line) for line in lines)


def _cached_note(view: ReportView) -> str:
    """``(cached: measured <when> by an earlier build ...)`` when the validate stage was restored from the cache."""
    raw = view.raw.get("latency") if isinstance(view.raw, Mapping) else None
    if not isinstance(raw, Mapping) or not raw.get("cached"):
        return ""
    when = f" {raw['measured_at']}" if raw.get("measured_at") else ""
    return f"(cached: measured{when} by an earlier build, not in this run; build without the cache to measure again)"


def _shape_text(shape: Any) -> str:
    """`` at image 4x3x16x16`` for a latency row's ``{input: dims}``."""
    if not isinstance(shape, Mapping) or not shape:
        return ""
    return " at " + ", ".join(f"{k} {'x'.join(str(d) for d in v)}" for k, v in shape.items() if isinstance(v, list))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _f(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}e}" if digits == 3 else f"{v:.{digits}f}"
    return str(v)


def _verdict(row: CheckRow) -> str:
    """ok / FAIL, or vacuous for a passing row whose reference and candidate are both constant."""
    if not row.passed:
        return "FAIL"
    if row.informational:
        return "info (spec-random, not judged)"
    return "vacuous" if row.vacuous else "ok"
