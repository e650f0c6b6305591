"""The release gate: does a build's report (and its artifacts) meet the release policy?

Used by ``deploy gate REPORT [--policy gate.toml] [--baseline OLD_REPORT]`` and, when deploy.toml has a
``[gate]`` table or ``deploy build --policy`` is given, at the end of ``deploy build``.

Every check is evaluated, then the gate fails once. The exit code is that of the first failing kind,
in this order: 9 artifact integrity (a file missing or differing from manifest.json), 6 the build
itself failed, 7 parity (disagreement, NaN/Inf, batch inconsistency, a required check skipped), 8
performance (latency regression against the baseline, or over the absolute budget).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgedeploy.artifacts import MANIFEST, REPORT
from edgedeploy.errors import (
    ArtifactIntegrityError,
    DeployError,
    InputError,
    ParityError,
    PerformanceRegressionError,
    StageError,
)
from edgedeploy.fileio.integrity import verify_artifacts
from edgedeploy.policy import GatePolicy
from edgedeploy.schema import dataclass_from_dict, read_toml
from edgedeploy.stagenames import GATE, VALIDATE
from edgedeploy.validate.parity import NON_FINITE

INTEGRITY, BUILD, PARITY, PERFORMANCE = 9, 6, 7, 8
_EXIT_ORDER = (INTEGRITY, BUILD, PARITY, PERFORMANCE)
_ERRORS: dict[int, Any] = {
    INTEGRITY: ArtifactIntegrityError,
    PARITY: ParityError,
    PERFORMANCE: PerformanceRegressionError,
}


@dataclass(frozen=True)
class GateCheck:
    """One rule of the policy applied to the report."""

    id: str
    kind: str  # integrity | build | parity | batch_consistency | latency | required
    passed: bool
    message: str
    exit_code: int = 0

    def line(self) -> str:
        return f"{'ok  ' if self.passed else 'FAIL'} {self.id}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class GateResult:
    checks: list[GateCheck]

    @property
    def failures(self) -> list[GateCheck]:
        return [c for c in self.checks if not c.passed]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        codes = {c.exit_code for c in self.failures}
        return next((c for c in _EXIT_ORDER if c in codes), 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": "passed" if self.passed else "failed",
            "exit_code": self.exit_code,
            "checks": [c.to_dict() for c in self.checks],
        }

    def error(self) -> DeployError:
        """The DeployError carrying this result's exit code (call only when it failed)."""
        failures = self.failures
        code = self.exit_code
        first = next(c for c in failures if c.exit_code == code)
        more = f" (+{len(failures) - 1} more failing checks)" if len(failures) > 1 else ""
        message = f"release gate failed: {first.id}: {first.message}{more}"
        if code == BUILD:
            return StageError(GATE, message, hint="fix the build failure first; see its report")
        err = _ERRORS[code](message, hint="see the failing checks listed above")
        if isinstance(err, ParityError):
            err.failures = [c.to_dict() for c in failures]
        return err


# ---- loading ------------------------------------------------------------------------------------------


def load_policy(path: str | Path) -> GatePolicy:
    """Read a gate policy TOML: either a ``[gate]`` table or the policy keys at top level.

    A relative ``baseline`` path is resolved against the policy file's folder.

    Raises:
        ConfigError: missing or unreadable file, invalid TOML, unknown key or wrong type (named).
    """
    path = Path(path)
    raw = read_toml(path, what="gate policy", hint="pass --policy PATH to a gate.toml")
    table = raw["gate"] if set(raw) == {"gate"} and isinstance(raw["gate"], dict) else raw
    policy: GatePolicy = dataclass_from_dict(GatePolicy, table, str(path))
    from edgedeploy.config_ranges import policy_problems, raise_if_problems

    raise_if_problems(policy_problems(policy), str(path))
    return _resolve_baseline(policy, path.resolve().parent)


def _resolve_baseline(policy: GatePolicy, base: Path) -> GatePolicy:
    if policy.baseline and not Path(policy.baseline).expanduser().is_absolute():
        return dataclasses.replace(policy, baseline=str(base / policy.baseline))
    return policy


def load_report(path: str | Path) -> tuple[dict[str, Any], Path]:
    """A report.json (or the build folder holding one) and the folder it is in.

    Raises:
        InputError: no such file, or not a JSON edgedeploy report.
    """
    path = Path(path)
    if path.is_dir():
        path = path / REPORT
    if not path.is_file():
        raise InputError(f"report not found: {path}", hint="pass a report.json or a folder written by 'deploy build'")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"report unreadable: {path} ({exc})") from None
    if not isinstance(report, dict) or not str(report.get("schema", "")).startswith("edgedeploy-report/"):
        raise InputError(f"{path}: not an edgedeploy report (no 'schema': 'edgedeploy-report/...')")
    return report, path.parent


# ---- evaluation ---------------------------------------------------------------------------------------


def evaluate(
    report: dict[str, Any],
    policy: GatePolicy,
    *,
    folder: Path | None = None,
    baseline: dict[str, Any] | None = None,
) -> GateResult:
    """Apply ``policy`` to ``report``; ``folder`` (with manifest.json) enables the integrity check.

    Without ``folder`` the integrity check is not evaluated (the build hook runs before the manifest exists).
    """
    checks: list[GateCheck] = []
    if folder is not None:
        checks.append(_integrity(folder))
        checks.append(_binding(folder, report))
    if report.get("status") != "passed":
        err = report.get("error") or {}
        code = PARITY if err.get("exit_code") == ParityError.exit_code else BUILD
        checks.append(GateCheck("build", "build", False, err.get("message", "the build did not pass"), code))
    checks += _parity(report, policy)
    checks += _required(report, policy, integrity_checked=folder is not None)
    checks += _latency(report, policy, baseline)
    return GateResult(checks)


def _integrity(folder: Path) -> GateCheck:
    try:
        names = verify_artifacts(folder)
    except ArtifactIntegrityError as exc:
        return GateCheck("integrity", "integrity", False, exc.message, INTEGRITY)
    return GateCheck("integrity", "integrity", True, f"{len(names)} artifacts match {MANIFEST}")


def _binding(folder: Path, report: dict[str, Any]) -> GateCheck:
    """The report, the manifest and the model they name belong together (see fileio.signing)."""
    from edgedeploy.fileio.integrity import read_manifest
    from edgedeploy.fileio.outdir import confined
    from edgedeploy.fileio.signing import binding_problems

    problems = binding_problems(report, read_manifest(folder) or {})
    model = report.get("model") or {}
    if not problems and str(model.get("artifact", "")).endswith("bundle.json"):
        # a device bundle: its bundle.json (bound above) must in turn match every file in the bundle
        from edgedeploy.device import complete_bundle as device

        try:
            device.verify_bundle(str(confined(folder, model["artifact"]).parent))
        except (device.BundleError, ArtifactIntegrityError) as exc:
            problems.append(exc.message)
    if problems:
        return GateCheck("binding", "integrity", False, "; ".join(problems), INTEGRITY)
    return GateCheck("binding", "integrity", True, f"report, manifest and {model.get('artifact')} agree")


def _signature(folder: Path, public_key: str | Path) -> GateCheck:
    from edgedeploy.fileio.signing import verify_release

    try:
        verify_release(folder, public_key)
    except ArtifactIntegrityError as exc:
        return GateCheck("signature", "integrity", False, exc.message, INTEGRITY)
    return GateCheck("signature", "integrity", True, f"every file of {folder} is as signed by {Path(public_key).name}")


def _judged(report: dict[str, Any], policy: GatePolicy) -> list[dict[str, Any]]:
    cands = (report.get("parity") or {}).get("candidates") or []
    return [c for c in cands if not policy.backends or c.get("name") in policy.backends]


def _parity(report: dict[str, Any], policy: GatePolicy) -> list[GateCheck]:
    """One check per (backend, check kind, output): all its rows must pass the build's and the policy's rules."""
    checks = []
    for cand in _judged(report, policy):
        name = cand.get("name", "?")
        if cand.get("status") == "skipped":
            continue
        if not cand.get("checks") and cand.get("status") == "failed":
            checks.append(GateCheck(f"parity:{name}", "parity", False, str(cand.get("reason")), PARITY))
            continue
        groups: dict[tuple[str, str], list[str]] = {}
        counts: dict[tuple[str, str], int] = {}
        for row in cand.get("checks", []):
            key = (row.get("check", "parity"), row.get("output", "?"))
            counts[key] = counts.get(key, 0) + 1
            problems = groups.setdefault(key, [])
            where = f"{row.get('shape')}#{row.get('sample')}"
            if not row.get("passed", False):
                problems.append(f"{where}: {row.get('reason', 'failed')}")
                continue
            problems += [f"{where}: {p}" for p in _policy_problems(row, cand.get("precision", "fp32"), policy)]
        for (kind, output), problems in groups.items():
            cid = f"{kind}:{name}:{output}"
            if problems:
                msg = f"{len(problems)} of {counts[(kind, output)]} failing; first: {problems[0]}"
                checks.append(GateCheck(cid, kind, False, msg, PARITY))
            else:
                checks.append(GateCheck(cid, kind, True, f"{counts[(kind, output)]} rows pass"))
    return checks


def _policy_problems(row: dict[str, Any], precision: str, policy: GatePolicy) -> list[str]:
    problems = []
    nonfinite = int(row.get("nan", 0) or 0) + int(row.get("inf", 0) or 0)
    if nonfinite > policy.max_nonfinite:
        problems.append(f"{NON_FINITE}: {nonfinite} NaN/Inf values > {policy.max_nonfinite} allowed")
    if row.get("check", "parity") != "parity":  # the minimums below are about agreement with PyTorch
        return problems
    min_cos = policy.min_cosine.get(precision)
    if min_cos is not None and row.get("cosine") is not None and row["cosine"] < min_cos:
        problems.append(f"cosine {row['cosine']:.6f} < gate minimum {min_cos} for {precision}")
    min_top1 = policy.min_top1_agreement.get(precision)
    if min_top1 is not None and row.get("top1_agreement") is not None and row["top1_agreement"] < min_top1:
        problems.append(f"top-1 agreement {row['top1_agreement']:.4f} < gate minimum {min_top1} for {precision}")
    return problems


def _required(report: dict[str, Any], policy: GatePolicy, *, integrity_checked: bool) -> list[GateCheck]:
    checks = []
    cands = _judged(report, policy)
    ran = [c for c in cands if c.get("status") != "skipped"]
    for kind in policy.required_checks:
        if kind == "integrity":
            continue  # evaluated by _integrity whenever a folder is given; the build hook runs before the manifest
        if kind == "latency":
            ok = bool(((report.get("latency") or {}).get("backends")) or {})
            why = (report.get("latency") or {}).get("reason", "no backend was timed")
            code = PERFORMANCE
        else:
            ok = any(r.get("check", "parity") == kind for c in ran for r in c.get("checks", []))
            why = (report.get("parity") or {}).get("reason") or f"no {kind} check ran"
            code = PARITY
        if not ok:
            checks.append(GateCheck(f"required:{kind}", "required", False, f"required check skipped: {why}", code))
    by_name = {c.get("name"): c for c in (report.get("parity") or {}).get("candidates") or []}
    for name in policy.required_backends:
        cand = by_name.get(name)
        if cand is None or cand.get("status") == "skipped":
            why = cand.get("reason", "skipped") if cand else "not in the report"
            checks.append(GateCheck(f"required:{name}", "required", False, f"required backend {name}: {why}", PARITY))
        elif cand.get("status") != "passed":
            checks.append(GateCheck(f"required:{name}", "required", False, f"required backend {name} failed", PARITY))
    return checks


def _latency(report: dict[str, Any], policy: GatePolicy, baseline: dict[str, Any] | None) -> list[GateCheck]:
    key = f"{policy.latency_metric}_ms"
    now = (report.get("latency") or {}).get("backends") or {}
    checks = []
    if policy.max_latency_ms is not None:
        deployed = [c.get("name") for c in _judged(report, policy) if c.get("deploy")]
        for name in deployed:
            if name in now:
                value = float(now[name][key])
                ok = value <= policy.max_latency_ms
                msg = f"{policy.latency_metric} {value:.3f} ms {'<=' if ok else '>'} budget {policy.max_latency_ms} ms"
                checks.append(GateCheck(f"latency:{name}", "latency", ok, msg, 0 if ok else PERFORMANCE))
    if baseline is not None:
        before = (baseline.get("latency") or {}).get("backends") or {}
        for name in sorted(set(now) & set(before)):
            old, new = float(before[name][key]), float(now[name][key])
            change = (new - old) / old * 100.0 if old > 0 else 0.0
            ok = change <= policy.max_latency_regression_pct
            msg = (
                f"{policy.latency_metric} {old:.3f} -> {new:.3f} ms ({change:+.1f}%, "
                f"allowed +{policy.max_latency_regression_pct:g}%)"
            )
            checks.append(GateCheck(f"regression:{name}", "latency", ok, msg, 0 if ok else PERFORMANCE))
    return checks


# ---- entry points -------------------------------------------------------------------------------------


def run_gate(
    report_path: str | Path,
    *,
    policy_path: str | Path | None = None,
    baseline_path: str | Path | None = None,
    verify_key: str | Path | None = None,
) -> GateResult:
    """``deploy gate``: load the report, policy and baseline, verify artifacts, evaluate.

    With ``verify_key`` the output folder's ``release.sig`` must verify against that public key,
    over every file in the folder (checked before anything in it is believed).

    Raises:
        InputError: the report, the baseline or the key is missing or unreadable.
        ConfigError: the policy file is invalid.
    """
    signature = None
    if verify_key is not None:
        path = Path(report_path)
        signature = _signature(path if path.is_dir() else path.parent, verify_key)
    report, folder = load_report(report_path)
    policy = load_policy(policy_path) if policy_path else GatePolicy()
    base = baseline_path or policy.baseline
    baseline = load_baseline(base, policy) if base else None
    # a failed build publishes no manifest: judge the failure itself, not the missing files
    checked = folder if report.get("status") == "passed" else None
    result = evaluate(report, policy, folder=checked, baseline=baseline)
    return GateResult([signature, *result.checks]) if signature else result


def load_baseline(path: str | Path, policy: GatePolicy) -> dict[str, Any]:
    """The baseline report, refused when a latency it holds is no measurement (0, negative, NaN, inf).

    A zero or NaN baseline would make every regression look like +0%, silently disabling the check.

    Raises:
        InputError: unreadable, or a backend's latency is not a positive finite number (named).
    """
    import math

    baseline = load_report(path)[0]
    key = f"{policy.latency_metric}_ms"
    bad = []
    for name, row in ((baseline.get("latency") or {}).get("backends") or {}).items():
        value = row.get(key) if isinstance(row, dict) else None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        if not ok:
            bad.append(f"{name} {key} = {value!r}")
    if bad:
        raise InputError(
            f"baseline {path}: " + "; ".join(bad) + " is not a latency measurement",
            hint="pass the report.json of a build whose latency was measured, or drop --baseline",
        )
    return baseline


def policy_for_build(cfg: Any) -> GatePolicy | None:
    """The build's gate policy: ``--policy`` / ``build.gate_policy`` file, else deploy.toml's ``[gate]``, else None.

    Raises:
        ConfigError: the policy file is invalid.
    """
    path = cfg.path(cfg.build.gate_policy)
    if path is not None:
        return load_policy(path)
    if cfg.gate is None:
        return None
    return _resolve_baseline(cfg.gate, Path(cfg.base_dir))


def judged_view(metrics: dict[str, Any]) -> dict[str, Any]:
    """The parts of a passing build's report the gate judges, from the stages' metrics so far
    (the same ``parity`` / ``latency`` entries report.json gets)."""
    validate = metrics.get(VALIDATE) or {}
    not_run = {"status": "skipped", "reason": "validate stage did not run"}
    return {
        "schema": "edgedeploy-report/1",
        "status": "passed",
        "parity": validate.get("parity", not_run),
        "latency": validate.get("latency", not_run),
    }
