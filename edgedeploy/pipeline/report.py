"""report.json (schema in README) and the human summary printed at the end of a build."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgedeploy import stagenames as names
from edgedeploy.artifacts import REPORT
from edgedeploy.config import DeployConfig
from edgedeploy.fileio.store import atomic_write_json
from edgedeploy.targets import TargetProfile

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
    if error:
        report["error"] = error
    return report


def summarize(validate: dict[str, Any]) -> dict[str, Any]:
    """Compact per-backend, per-shape, per-output max-abs-error view for the manifest and the table."""
    parity = validate.get("parity") or {}
    out: dict[str, Any] = {"parity_status": parity.get("status", "skipped")}
    rows = {}
    for cand in parity.get("candidates", []):
        for check in cand.get("checks", []):
            rows[f"{cand['name']}@{check['shape']}:{check['output']}"] = check.get("max_abs")
    out["max_abs_error"] = rows
    return out


def write_report_files(report: dict[str, Any], folder: Path, plot_cache: Path | None = None) -> list[str]:
    """Write report.json, report.junit.xml, report.md and report.html into ``folder``; return their names."""
    from edgedeploy.pipeline import report_formats

    atomic_write_json(folder / REPORT, report)
    return [REPORT, *report_formats.write_all(report, folder, plot_cache)]


def results_table(report: dict[str, Any]) -> str:
    """Plain-text table of every parity check, for the end of ``deploy build``."""
    lines = []
    parity = report.get("parity") or {}
    lat = report.get("latency") or {}
    if not parity.get("candidates") and lat.get("status") == "skipped":
        # bundle-only builds: one line, not an empty table
        same = lat.get("reason", "") == parity.get("reason", "")
        tail = "" if same else f"; latency: skipped ({lat.get('reason', '')})"
        return f"parity and latency: {parity.get('status', 'skipped')} ({parity.get('reason', '')}){tail}"
    header = f"{'backend':<16} {'shape':<6} {'output':<16} {'max_abs':>10} {'p99_abs':>10} {'cosine':>9}  result"
    lines.append(header)
    lines.append("-" * len(header))
    for cand in parity.get("candidates", []):
        if not cand.get("checks"):  # skipped (no TensorRT) or could not run
            lines.append(f"{cand['name']:<16} {cand.get('status', '')}: {cand.get('reason', '')}")
        for c in cand.get("checks", []):
            lines.append(
                f"{cand['name']:<16} {c['shape']:<6} {c['output']:<16} {_f(c.get('max_abs')):>10} "
                f"{_f(c.get('p99_abs')):>10} {_f(c.get('cosine'), 6):>9}  {_verdict(c)}"
            )
    if not parity.get("candidates"):
        lines.append(f"parity: {parity.get('status', 'skipped')} ({parity.get('reason', '')})")
    for name, row in (lat.get("backends") or {}).items():
        lines.append(
            f"latency {name}: p50 {row['p50_ms']:.3f} ms, p90 {row['p90_ms']:.3f} ms, "
            f"p99 {row['p99_ms']:.3f} ms, {row['throughput']:.1f} samples/s at {row['shape']}"
        )
    if lat.get("status") == "skipped":
        lines.append(f"latency: skipped ({lat.get('reason', '')})")
    return "\n".join(lines)


def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}e}" if digits == 3 else f"{v:.{digits}f}"
    return str(v)


def _verdict(row: dict[str, Any]) -> str:
    """ok / FAIL, or vacuous for a passing row whose reference and candidate are both constant."""
    if not row.get("passed"):
        return "FAIL"
    return "vacuous" if row.get("vacuous") else "ok"
