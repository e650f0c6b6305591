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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgedeploy.artifacts import MANIFEST, REPORT
from edgedeploy.errors import (
    ArtifactIntegrityError,
    ConfigError,
    DeployError,
    InputError,
    ParityError,
    PerformanceRegressionError,
    StageError,
)
from edgedeploy.fileio.integrity import verify_artifacts
from edgedeploy.fileio.outdir import FAILED_DIR
from edgedeploy.jsonread import read_json
from edgedeploy.policy import GatePolicy
from edgedeploy.reportview import BuildFailure, Candidate, CheckRow, ReportView
from edgedeploy.schema import dataclass_from_dict, read_toml
from edgedeploy.stagenames import GATE, VALIDATE
from edgedeploy.validate.parity import (
    NON_FINITE,
    POOLED_COSINE_CHECK,
    REAL_DATA_POINTS,
    TOP1_CHECK,
    judges_agreement,
)

if TYPE_CHECKING:
    from edgedeploy.config import DeployConfig

INTEGRITY, BUILD, PARITY, PERFORMANCE = 9, 6, 7, 8
_EXIT_ORDER = (INTEGRITY, BUILD, PARITY, PERFORMANCE)
# what to do about each kind of failure (the failing checks themselves are listed above the verdict)
_GATE_FIXES = {
    INTEGRITY: "rebuild into this folder (deploy build ... --out DIR), or restore it from the release it was copied "
    "from; never edit a built folder by hand",
    PARITY: "see the failing checks above: fix the model or its data, or widen [tolerance] only if the difference "
    "is acceptable for the release",
    PERFORMANCE: "see the timings above: find what slowed the artifact, or update the baseline if the change is "
    "intended (--baseline NEW/report.json)",
}
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
    """Every check of one verdict; ``fixes`` holds the fix for an exit code whose failures have a cause more
    specific than the kind's own (a required check that did not run, a latency budget), else the kind's."""

    checks: list[GateCheck]
    fixes: Mapping[int, str] = dataclasses.field(default_factory=dict)

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
            return StageError(GATE, message, hint=self.fixes.get(BUILD, "fix the build failure first; see its report"))
        err = _ERRORS[code](message, hint=self.fixes.get(code, _GATE_FIXES[code]))
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
    if "gate" in raw and isinstance(raw["gate"], dict) and set(raw) != {"gate"}:
        stray = sorted(k for k in raw if k != "gate")
        raise ConfigError(
            f"{path}: a [gate] table and other keys or tables ({', '.join(stray)}) beside it",
            hint="put every policy key inside [gate], or write them all at top level without [gate]",
        )
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
        failed = path.parent / FAILED_DIR / REPORT
        if path.name == REPORT and failed.is_file():  # a folder whose only build failed: its report is there
            raise InputError(
                f"report not found: {path}: {path.parent} holds only a failed run",
                hint=f"deploy gate {failed} judges that run (a failed build: exit 6); a passing build writes {path}",
            )
        raise InputError(f"report not found: {path}", hint="pass a report.json or a folder written by 'deploy build'")
    try:
        report = read_json(path, follow_links=True)  # the path the user named; a FIFO or a device is refused
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"report unreadable: {path} ({exc})") from None
    if not isinstance(report, dict) or not str(report.get("schema", "")).startswith("edgedeploy-report/"):
        raise InputError(f"{path}: not an edgedeploy report (no 'schema': 'edgedeploy-report/...')")
    return report, path.parent


def read_report(path: str | Path) -> tuple[ReportView, Path]:
    """:func:`load_report` as the gate reads it: a typed view, every key it judges checked.

    Raises:
        InputError: no such file, not an edgedeploy report, or a key of the wrong type (named).
    """
    report, folder = load_report(path)
    return ReportView.parse(report, str(Path(path) / REPORT if Path(path).is_dir() else path)), folder


# ---- evaluation ---------------------------------------------------------------------------------------


def evaluate(
    report: ReportView | Mapping[str, Any],
    policy: GatePolicy,
    *,
    folder: Path | None = None,
    baseline: ReportView | Mapping[str, Any] | None = None,
) -> GateResult:
    """Apply ``policy`` to ``report``; ``folder`` (with manifest.json) enables the integrity check.

    Without ``folder`` the integrity check is not evaluated (the build hook runs before the manifest exists).

    Raises:
        InputError: ``report`` or ``baseline`` given as a dict is no edgedeploy report, or has a key of the
            wrong type.
    """
    view = report if isinstance(report, ReportView) else ReportView.parse(report)
    before = baseline if baseline is None or isinstance(baseline, ReportView) else ReportView.parse(baseline)
    checks: list[GateCheck] = []
    build_fix = ""
    if folder is not None:
        checks.append(_integrity(folder))
        checks.append(_binding(folder, view))
        device = _device_outputs(folder, view)
        if device is not None:
            checks.append(device)
    if view.status != "passed":
        err = view.error or BuildFailure()
        code = PARITY if err.exit_code == ParityError.exit_code else BUILD
        # the build's own message without its fix: the gate's line carries that fix once, as its own
        said, _, own_fix = (err.message or "the build did not pass").partition(" -- fix: ")
        checks.append(GateCheck("build", "build", False, said, code))
        build_fix = own_fix
    checks += _parity(view, policy)
    checks += _required(view, policy, integrity_checked=folder is not None)
    checks += _latency(view, policy, before)
    fixes = _fixes(view, policy, checks, folder)
    if build_fix:
        fixes[BUILD] = f"fix the build failure first: {build_fix}"
    return GateResult(checks, fixes)


def _did_not_run(check: GateCheck) -> bool:
    """A failing check whose cause is that something required was not run (not that it ran and failed)."""
    if check.id.startswith("required:"):
        return not check.message.endswith(" failed")  # "required backend X failed": it ran
    return check.id.startswith("latency:") and check.message.startswith("no ")  # a budget with no timing


def _awaits_device(report: ReportView) -> bool:
    """A TensorRT device bundle: its engine is built and validated by the device step, not on this host."""
    from edgedeploy.fileio.signing import report_model

    return str(report_model(report.raw).get("artifact", "")).endswith("bundle.json")


def _fixes(report: ReportView, policy: GatePolicy, checks: list[GateCheck], folder: Path | None) -> dict[int, str]:
    """The fix per exit code where the failing checks of that code tell more than the kind's general fix:
    a required check or timing that never ran is not fixed by the model or a tolerance, and a budget missed
    with no baseline is not fixed by a baseline."""
    failing = [c for c in checks if not c.passed]
    fixes: dict[int, str] = {}
    parity = [c for c in failing if c.exit_code == PARITY]
    if parity and all(_did_not_run(c) for c in parity):
        fixes[PARITY] = _not_run_fix(report, policy, folder, parity)
    slow = [c for c in failing if c.exit_code == PERFORMANCE]
    parts = []
    if any(_did_not_run(c) for c in slow):
        parts.append(_not_run_fix(report, policy, folder, [c for c in slow if _did_not_run(c)]))
    if any(c.id.startswith("latency:") and not _did_not_run(c) for c in slow):
        parts.append(
            f"speed the artifact up (a lower precision, a faster target) or raise or remove max_latency_ms "
            f"({policy.max_latency_ms} ms) in the gate policy"
        )
    if any(c.id.startswith("regression") for c in slow):
        parts.append(_GATE_FIXES[PERFORMANCE])
    if parts:
        fixes[PERFORMANCE] = "; ".join(parts)
    return fixes


def _not_run_fix(report: ReportView, policy: GatePolicy, folder: Path | None, missing: list[GateCheck]) -> str:
    """What applies when required checks did not run: run them where they run (a bundle's device step), or gate
    with a policy that requires what did run."""
    ran = [c for c in _judged(report, policy) if c.status != "skipped"]
    kinds = ["integrity", *sorted({r.check for c in ran for r in c.checks} & {"parity", "batch_consistency"})]
    if report.latency.backends:
        kinds.append("latency")
    require = f"required_checks = {json.dumps(kinds)}"
    if policy.required_backends:
        require += f", required_backends = {json.dumps([c.name for c in ran if c.status == 'passed'])}"
    if _awaits_device(report):
        from edgedeploy.fileio.signing import report_model

        out = str(folder) if folder is not None else "OUT"
        bundle = Path(out) / Path(report_model(report.raw)["artifact"]).parent
        target = report.raw.get("target") if isinstance(report.raw.get("target"), str) else "TARGET"
        return (
            f"the engine is built and validated on the device: run the device step (deploy device run {out} "
            f"--host {target}=user@device, or deploy bundle complete {bundle} where edgedeploy and "
            f"the target's TensorRT are installed) and gate again, or gate the host stages alone with --policy "
            f"FILE holding {require}"
        )
    names = ", ".join(dict.fromkeys(c.id.split(":", 1)[1] for c in missing))
    return (
        f"{names} did not run in this build: rebuild where {names} can run, or gate with --policy FILE "
        f"requiring what ran: {require}"
    )


def _integrity(folder: Path) -> GateCheck:
    try:
        names = verify_artifacts(folder)
    except ArtifactIntegrityError as exc:
        return GateCheck("integrity", "integrity", False, exc.message, INTEGRITY)
    return GateCheck("integrity", "integrity", True, f"{len(names)} artifacts match {MANIFEST}")


def _binding(folder: Path, report: ReportView) -> GateCheck:
    """The report, the manifest and the model they name belong together (see fileio.signing)."""
    from edgedeploy.fileio.integrity import read_manifest
    from edgedeploy.fileio.outdir import confined
    from edgedeploy.fileio.signing import binding_problems, report_model

    problems = binding_problems(dict(report.raw), read_manifest(folder) or {})
    model = report_model(report.raw)
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


def _device_outputs(folder: Path, report: ReportView) -> GateCheck | None:
    """A device-completed bundle: ``validation.json`` passed, on the engine ``engine.json`` describes, which is
    ``model.engine`` byte for byte, built from the bundle's ONNX model. None when the device step has not run.

    This proves the device outputs agree with each other and with the signed-for bundle; who wrote them is
    the signature's job (``deploy sign`` again after the device step, ``--verify-key``).
    """
    from edgedeploy.fileio.hashing import sha256_file
    from edgedeploy.fileio.outdir import DEVICE_OUTPUTS, confined
    from edgedeploy.fileio.signing import report_model

    model = report_model(report.raw)
    if not str(model.get("artifact", "")).endswith("bundle.json"):
        return None
    try:
        bundle = confined(folder, model["artifact"]).parent
    except ArtifactIntegrityError:
        return None  # the binding check names it
    present = [n for n in DEVICE_OUTPUTS if (bundle / n).is_file()]
    if not present or present == ["timing.cache"]:
        return None
    where = bundle.relative_to(folder).as_posix()

    def fail(message: str, code: int = INTEGRITY) -> GateCheck:
        return GateCheck("device", "integrity" if code == INTEGRITY else "parity", False, message, code)

    def read(name: str) -> dict[str, Any] | None:
        try:
            data = read_json(bundle / name)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    validation = read("validation.json")
    if validation is None:
        return fail(f"{where}: device outputs ({', '.join(present)}) without a readable validation.json")
    if validation.get("status") != "passed":
        return fail(f"{where}/validation.json: the device validation did not pass ({validation.get('status')})", PARITY)
    from edgedeploy.remote.results import check_device_results

    runner = "tensorrt" if str(validation.get("runner", "")).startswith("tensorrt") else "onnxruntime"
    try:  # the rows, pooled verdicts and status agree with the bundle's goldens and tolerance, as on a merge
        check_device_results(bundle, bundle, runner=runner, host=where)
    except (ArtifactIntegrityError, InputError) as exc:
        return fail(exc.message)
    record = validation.get("engine")
    engine_file = bundle / "model.engine"
    if record is None:
        if engine_file.exists() or (bundle / "engine.json").exists():
            return fail(f"{where}: model.engine / engine.json present, but validation.json validated no engine")
        return GateCheck("device", "integrity", True, f"{where}: validated on the device by {validation.get('runner')}")
    if not isinstance(record, dict):
        return fail(f"{where}/validation.json: 'engine' is not an engine record")
    if read("engine.json") != record:
        return fail(f"{where}/engine.json differs from the engine validation.json validated")
    if not engine_file.is_file() or sha256_file(engine_file) != record.get("engine_sha256"):
        return fail(f"{where}/model.engine: sha256 differs from engine.json (replaced after validation)")
    manifest = read("bundle.json") or {}
    files, source = manifest.get("files"), record.get("source_onnx")
    onnx_sha = files.get(source) if isinstance(files, dict) and isinstance(source, str) else None
    if not onnx_sha or onnx_sha != record.get("source_onnx_sha256"):
        return fail(f"{where}/engine.json: built from {record.get('source_onnx')!r}, not the bundle's ONNX model")
    gpu = record.get("gpu")
    gpu_name = gpu.get("name", "?") if isinstance(gpu, dict) else "?"
    return GateCheck(
        "device",
        "integrity",
        True,
        f"{where}: model.engine validated on the device (TensorRT {record.get('tensorrt')}, {gpu_name})",
    )


def _signature(folder: Path, public_key: str | Path) -> GateCheck:
    from edgedeploy.fileio.signing import verify_release

    try:
        verify_release(folder, public_key)
    except ArtifactIntegrityError as exc:
        message = f"{exc.message} ({exc.hint})" if exc.hint and "deploy sign" in exc.hint else exc.message
        return GateCheck("signature", "integrity", False, message, INTEGRITY)
    return GateCheck("signature", "integrity", True, f"every file of {folder} is as signed by {Path(public_key).name}")


def _judged(report: ReportView, policy: GatePolicy) -> list[Candidate]:
    return [c for c in report.parity.candidates if not policy.backends or c.name in policy.backends]


def _parity(report: ReportView, policy: GatePolicy) -> list[GateCheck]:
    """One check per (backend, check kind, output): all its rows must pass the build's and the policy's rules."""
    checks = []
    for cand in _judged(report, policy):
        if cand.status == "skipped":
            continue
        if not cand.checks and cand.status == "failed":
            checks.append(GateCheck(f"parity:{cand.name}", "parity", False, str(cand.reason), PARITY))
            continue
        groups: dict[tuple[str, str], list[str]] = {}
        counts: dict[tuple[str, str], int] = {}
        real = any(row.shape in REAL_DATA_POINTS for row in cand.checks)  # which goldens judge agreement
        for row in cand.checks:
            key = (row.check, row.output)
            counts[key] = counts.get(key, 0) + 1
            problems = groups.setdefault(key, [])
            if not row.passed:
                problems.append(f"{row.where}: {row.reason}")
                continue
            problems += [f"{row.where}: {p}" for p in _policy_problems(row, cand.precision, policy, real)]
        min_top1 = policy.min_top1_agreement.get(cand.precision)
        if min_top1 is not None and cand.checks and not any(row.check == TOP1_CHECK for row in cand.checks):
            # a minimum with nothing to apply it to never passes in silence: the build judged no top-1
            classified = any(row.top1_agreement is not None for row in cand.checks)
            cause = (
                f"the build pooled no top-1 (set tolerance.{cand.precision}.min_topk_agreement and rebuild"
                if classified
                else "the build names no validate.classifier_outputs (name them and rebuild"
            )
            checks.append(
                GateCheck(
                    f"{TOP1_CHECK}:{cand.name}",
                    TOP1_CHECK,
                    False,
                    f"the policy's min_top1_agreement for {cand.precision} ({min_top1}) has no top-1 row of "
                    f"{cand.name} to apply to: {cause}, or drop the minimum)",
                    PARITY,
                )
            )
        for (kind, output), problems in groups.items():
            cid = f"{kind}:{cand.name}:{output}"
            if problems:
                msg = f"{len(problems)} of {counts[(kind, output)]} failing; first: {problems[0]}"
                checks.append(GateCheck(cid, kind, False, msg, PARITY))
            else:
                checks.append(GateCheck(cid, kind, True, f"{counts[(kind, output)]} rows pass"))
    return checks


def _policy_problems(row: CheckRow, precision: str, policy: GatePolicy, real: bool = True) -> list[str]:
    problems = []
    nonfinite = row.nan + row.inf
    if nonfinite > policy.max_nonfinite:
        problems.append(f"{NON_FINITE}: {nonfinite} NaN/Inf values > {policy.max_nonfinite} allowed")
    # "not judged" is the build's word for a spec-random golden of an FP16/INT8 artifact: anywhere else (an FP32
    # artifact, a real-sample golden) a row that says so is excusing itself from the rules, and fails
    excused = not row.agreement_judged and row.sample is not None
    if excused and judges_agreement(str(row.shape), precision, real):
        problems.append(f"marked not judged for agreement, but a {precision} golden at {row.shape} is judged")
        excused = False
    if row.check not in ("parity", POOLED_COSINE_CHECK, TOP1_CHECK) or excused:
        # the minimums below are about agreement with PyTorch, judged where the build judged it (real samples
        # for FP16/INT8: edgedeploy.validate.parity.judge_goldens)
        return problems
    min_cos = policy.min_cosine.get(precision)
    if min_cos is not None and row.cosine is not None and row.cosine < min_cos:
        problems.append(f"cosine {row.cosine:.6f} < gate minimum {min_cos} for {precision}")
    min_top1 = policy.min_top1_agreement.get(precision)
    # top-1 agreement pooled over the real samples, as the build pools it, not per golden (one golden of batch 1
    # agrees 0 or 1); the policy's minimum applies to the observed agreement (the build's to its upper bound)
    if row.check == TOP1_CHECK and min_top1 is not None and row.top1_agreement is not None:
        if row.top1_agreement < min_top1:
            problems.append(f"top-1 agreement {row.top1_agreement:.4f} < gate minimum {min_top1} for {precision}")
    return problems


def _required(report: ReportView, policy: GatePolicy, *, integrity_checked: bool) -> list[GateCheck]:
    checks = []
    ran = [c for c in _judged(report, policy) if c.status != "skipped"]
    for kind in policy.required_checks:
        if kind == "integrity":
            continue  # evaluated by _integrity whenever a folder is given; the build hook runs before the manifest
        if kind == "latency":
            ok = bool(report.latency.backends)
            why = report.latency.reason or "no backend was timed"
            code = PERFORMANCE
        else:
            # the artifact that ships must have been compared: a stand-in (the bundle's ONNX model run by ONNX
            # Runtime on the device) is reported, not accepted in its place, unless the policy names it
            shipped = ran if policy.backends or kind != "parity" else [c for c in ran if c.deploy]
            ok = any(r.check == kind for c in shipped for r in c.checks)
            why = report.parity.reason or f"no {kind} check ran"
            stand_ins = ", ".join(c.name for c in ran if not c.deploy)
            if not ok and kind == "parity" and not policy.backends and stand_ins:
                why = f"{why}; the deployed artifact was not compared (only {stand_ins}, not what ships)"
            code = PARITY
        if not ok:
            checks.append(GateCheck(f"required:{kind}", "required", False, f"required check skipped: {why}", code))
    for name in policy.required_backends:
        cand = report.parity.candidate(name)
        if cand is None or cand.status == "skipped":
            why = (cand.reason if cand.reason is not None else "skipped") if cand else "not in the report"
            checks.append(GateCheck(f"required:{name}", "required", False, f"required backend {name}: {why}", PARITY))
        elif cand.status != "passed":
            checks.append(GateCheck(f"required:{name}", "required", False, f"required backend {name} failed", PARITY))
    return checks


def _latency(report: ReportView, policy: GatePolicy, baseline: ReportView | None) -> list[GateCheck]:
    key = f"{policy.latency_metric}_ms"
    now = report.latency.backends
    checks = []
    if policy.max_latency_ms is not None:
        for name in [c.name for c in _judged(report, policy) if c.deploy]:
            if name not in now:  # a budget with nothing to hold to it never passes in silence
                why = report.latency.reason or f"{name} was not timed"
                budget = f"the {policy.max_latency_ms} ms budget"
                msg = f"no {policy.latency_metric} timing of {name} to hold to {budget}: {why}"
                checks.append(GateCheck(f"latency:{name}", "latency", False, msg, PERFORMANCE))
                continue
            value = _timing(now[name].value(key), name, key)
            ok = value <= policy.max_latency_ms
            msg = f"{policy.latency_metric} {value:.3f} ms {'<=' if ok else '>'} budget {policy.max_latency_ms} ms"
            checks.append(GateCheck(f"latency:{name}", "latency", ok, msg, 0 if ok else PERFORMANCE))
    if baseline is not None:
        before = baseline.latency.backends
        pairs = _regression_pairs(report, baseline, policy)
        if not pairs:  # a baseline was asked for: say why nothing was compared, never pass in silence
            why = "no backend to compare: " + (
                "none of the policy's backends was timed in both reports"
                if policy.backends
                else "a report names no deployed artifact (deploy: true)"
            )
            checks.append(GateCheck("regression", "latency", False, why, PERFORMANCE))
        for was, name in pairs:
            if name not in now:
                why = f"no {policy.latency_metric} timing of {name} in this report to compare with the baseline's"
                checks.append(GateCheck(f"regression:{name}", "latency", False, why, PERFORMANCE))
                continue
            if was not in before:
                raise InputError(
                    f"baseline: no latency of {was}, the backend it deployed",
                    hint="pass a timed build's report.json as --baseline (a TensorRT build's after its device step)",
                )
            shapes = _timed_shape(before[was]), _timed_shape(now[name])
            if None not in shapes and shapes[0] != shapes[1]:
                # a batch of 16 against a batch of 1 says nothing about a regression either way
                why = (
                    f"{name} was timed at {shapes[1]}, the baseline's {was} at {shapes[0]}: not comparable "
                    "(rebuild the baseline with the same dims)"
                )
                checks.append(GateCheck(f"regression:{name}", "latency", False, why, PERFORMANCE))
                continue
            old = _timing(before[was].value(key), was, key)
            new = _timing(now[name].value(key), name, key)
            change = (new - old) / old * 100.0 if old > 0 else 0.0
            ok = change <= policy.max_latency_regression_pct
            than = "" if was == name else f" (baseline {was})"
            msg = (
                f"{policy.latency_metric} {old:.3f} -> {new:.3f} ms ({change:+.1f}%, "
                f"allowed +{policy.max_latency_regression_pct:g}%){than}"
            )
            checks.append(GateCheck(f"regression:{name}", "latency", ok, msg, 0 if ok else PERFORMANCE))
    return checks


def _timed_shape(row: Any) -> Any:
    """The input shapes a latency row was timed at (None where the report does not say)."""
    return row.shape if isinstance(row.shape, dict) and row.shape else None


def _regression_pairs(report: ReportView, baseline: ReportView, policy: GatePolicy) -> list[tuple[str, str]]:
    """(baseline backend, this report's backend) pairs a regression check compares: the backends the policy
    names, each with itself where both reports timed it; else the artifact each report deployed (an INT8 build's
    ``onnxruntime-int8`` against an FP32 baseline's ``onnxruntime-fp32``), not the by-products beside it."""
    if policy.backends:
        timed = set(report.latency.backends) & set(baseline.latency.backends)
        return [(name, name) for name in sorted(timed & set(policy.backends))]
    mine = [c.name for c in report.parity.candidates if c.deploy]
    theirs = [c.name for c in baseline.parity.candidates if c.deploy]
    return [(theirs[0], mine[0])] if mine and theirs else []


def _timing(value: float | None, name: str, key: str) -> float:
    if value is None:
        raise InputError(f"report: latency.backends.{name} has no {key}", hint="pass a report.json of a timed build")
    return value


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
    report, folder = read_report(report_path)
    policy = load_policy(policy_path) if policy_path else GatePolicy()
    base = baseline_path or policy.baseline
    baseline = load_baseline(base, policy) if base else None
    # a failed build publishes no manifest: judge the failure itself, not the missing files
    checked = folder if report.status == "passed" else None
    result = evaluate(report, policy, folder=checked, baseline=baseline)
    return GateResult([signature, *result.checks], result.fixes) if signature else result


def load_baseline(path: str | Path, policy: GatePolicy) -> ReportView:
    """The baseline report, refused when a latency it holds is no measurement (0, negative, NaN, inf).

    A zero or NaN baseline would make every regression look like +0%, silently disabling the check.

    Raises:
        InputError: unreadable, a key of the wrong type, or a backend's latency is not a positive finite
            number (named).
    """
    baseline = read_report(path)[0]
    baseline.refuse_unmeasured_latency(f"{policy.latency_metric}_ms", str(path))
    return baseline


def policy_for_build(cfg: DeployConfig) -> GatePolicy | None:
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


def judged_view(metrics: Mapping[str, Any]) -> ReportView:
    """The parts of a passing build's report the gate judges, from the stages' metrics so far
    (the same ``parity`` / ``latency`` entries report.json gets).

    Raises:
        InputError: the validate stage's metrics do not read as a report (a bug in that stage).
    """
    validate = metrics.get(VALIDATE) or {}
    not_run = {"status": "skipped", "reason": "validate stage did not run"}
    view = {
        "schema": "edgedeploy-report/1",
        "status": "passed",
        "parity": validate.get("parity", not_run),
        "latency": validate.get("latency", not_run),
    }
    return ReportView.parse(view, "the build's report")
