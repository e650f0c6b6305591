"""What a device sent back, checked against the bundle this host built, and turned into report rows.

The device is trusted to run the step, not to say anything it likes: a ``validation.json`` must cover
exactly the goldens the bundle holds (every point, sample and output), each row's verdict must agree
with its own figures and the bundle's tolerance (a NaN count, a wrong shape, a cosine under the minimum or
an error larger than ``atol + rtol * max|reference|`` cannot pass), the overall status must be what the rows
say, and with TensorRT the engine must hash to what ``engine.json`` records, built from the bundle's ONNX
model for its target and precision. Anything else is :class:`ArtifactIntegrityError` (exit 9), naming the
host. These checks catch a corrupted, truncated or hand-edited result; a device that is itself compromised
can still lie consistently (sign the release only after the devices you trust ran it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.errors import ArtifactIntegrityError, InputError
from edgedeploy.fileio.hashing import sha256_file
from edgedeploy.jsonread import read_json
from edgedeploy.reportview import ReportView
from edgedeploy.validate.parity import REAL_DATA_POINTS, judges_agreement, pooled_top1, vacuous_verdict

VALIDATION = "validation.json"
ENGINE_RECORD = "engine.json"
ENGINE_SCHEMA = "edgedeploy-engine/1"


def _read_json(path: Path, what: str, host: str) -> dict[str, Any]:
    try:
        data = read_json(path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactIntegrityError(f"{host}: {what} unreadable ({exc})", hint="run the device step again") from None
    if not isinstance(data, dict):
        raise ArtifactIntegrityError(f"{host}: {what} is not a JSON object", hint="run the device step again")
    return data


def golden_references(goldens: Path) -> dict[tuple[str, int, str], tuple[list[int], float]]:
    """(point, sample, output) -> (reference shape, max |reference|) from a bundle's goldens.npz."""
    out: dict[tuple[str, int, str], tuple[list[int], float]] = {}
    with np.load(goldens, allow_pickle=False) as data:
        for key in data.files:
            point, sample, kind, name = key.split("/", 3)
            if kind == "out":
                arr = data[key].astype(np.float64)
                finite = arr[np.isfinite(arr)]
                out[(point, int(sample), name)] = (list(arr.shape), float(np.abs(finite).max()) if finite.size else 0.0)
    return out


def _row_problems(
    row: dict[str, Any], ref: tuple[list[int], float], tol: dict[str, Any], *, judged: bool = True
) -> list[str]:
    """Why a row marked passed cannot have passed, from its own figures (empty: it can). ``judged``: whether the
    row's golden judges agreement (:func:`edgedeploy.validate.parity.judges_agreement`, from the bundle's own
    precision and goldens): a row may not excuse itself from the tolerance by saying it is not judged."""
    problems = []
    if row.get("agreement_judged") is False and judged:
        problems.append("marked agreement_judged false on a golden that judges agreement")
    if not row.get("passed"):
        return problems
    shape, max_ref = ref
    if row.get("shape_ref") not in (None, shape) or row.get("shape_cand") not in (None, shape):
        problems.append(f"shapes {row.get('shape_ref')} / {row.get('shape_cand')} differ from the golden's {shape}")
    if int(row.get("nan") or 0) or int(row.get("inf") or 0):
        problems.append(f"{row.get('nan')} NaN / {row.get('inf')} Inf values marked passed")
    # cosine is n/a (None, with the reason in cosine_na) on outputs it is undefined for (under 3 elements, a
    # near-zero reference): the same rule as parity.py's on the host
    figures = [row.get("max_abs")] + ([] if row.get("cosine") is None and row.get("cosine_na") else [row.get("cosine")])
    if any(not isinstance(f, (int, float)) or isinstance(f, bool) or not math.isfinite(f) for f in figures):
        return [*problems, "no finite max_abs / cosine figures"]
    if row.get("agreement_judged") is False and not judged:  # a spec-random golden of FP16/INT8: informational
        return problems
    max_abs = float(row["max_abs"])
    cosine = None if row.get("cosine") is None else float(row["cosine"])
    atol, rtol = tol.get("atol"), tol.get("rtol")
    if atol is not None or rtol is not None:
        bound = (atol or 0.0) + (rtol or 0.0) * max_ref
        if max_abs > bound * (1 + 1e-9) + 1e-12:
            problems.append(f"max_abs {max_abs:.3e} exceeds atol + rtol * max|reference| = {bound:.3e}")
    min_cos = tol.get("min_cosine")
    if min_cos is not None and cosine is not None and cosine < min_cos:
        problems.append(f"cosine {cosine:.6f} < {min_cos}")
    return problems


def _pooled_problems(rows: list[dict[str, Any]], tol: dict[str, Any], real: bool) -> list[str]:
    """Why the device's pooled rows (``sample`` None) cannot be the ones its own per-golden rows give: the pooled
    top-1 and vacuous verdicts are derived again here, by the same functions and the bundle's tolerance, and must
    be there with the same verdict and figure; a pooled top-1 or vacuous row the goldens do not give is refused
    too (the other pooled checks need the outputs: they may only fail)."""
    per_golden = [r for r in rows if r.get("sample") is not None]
    for r in per_golden:  # top1_agreement itself was read as a share by ReportView.parse (check_device_results)
        n = r.get("top1_rows", 1)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            return [f"{r.get('shape')}#{r.get('sample')} {r.get('output')}: top1_rows {n!r} is not a count"]
    derived = pooled_top1(per_golden, tol.get("min_topk_agreement")) + vacuous_verdict(per_golden, real)
    sent: dict[tuple[str, str], dict[str, Any]] = {
        (str(r.get("check")), str(r.get("output"))): r for r in rows if r.get("sample") is None
    }
    problems = []
    for want in derived:
        pooled = (str(want["check"]), str(want["output"]))
        got = sent.pop(pooled, None)
        if got is None:
            problems.append(f"pooled {pooled[0]} row of {pooled[1]} missing")
        elif bool(got.get("passed")) != want["passed"]:
            problems.append(f"pooled {pooled[0]} of {pooled[1]} marked {'passed' if got.get('passed') else 'failed'}; "
                            f"its per-golden rows say {'passed' if want['passed'] else 'failed'}")  # fmt: skip
        elif "top1_agreement" in want and not _same_figure(got.get("top1_agreement"), want["top1_agreement"]):
            problems.append(f"pooled top-1 of {pooled[1]} is {got.get('top1_agreement')!r}; its rows give "
                            f"{want['top1_agreement']:.6f}")  # fmt: skip
    for (check, output), row in sent.items():
        if check in ("top1_agreement", "vacuous"):
            problems.append(f"pooled {check} row of {output} the per-golden rows do not give")
        elif row.get("passed"):
            problems.append(f"pooled {check} row of {output} marked passed (such a row only reports a failure)")
    return problems


def _same_figure(got: Any, want: float) -> bool:
    ok = isinstance(got, (int, float)) and not isinstance(got, bool) and math.isfinite(got)
    return ok and abs(float(got) - want) <= 1e-9 + 1e-9 * abs(want)


def _latency_problems(latency: Any, runner: str) -> list[str]:
    """Why the device's ``latency`` block cannot be a timing (None: not timed). Only the engine is timed."""
    if latency is None:
        return []
    if runner != "tensorrt":
        return ["a latency block from a runner that times nothing"]
    if not isinstance(latency, dict):
        return [f"latency is {type(latency).__name__}, not a table"]
    problems = []
    figures = [latency.get(k) for k in ("p50_ms", "p90_ms", "p99_ms")]
    timed = [float(f) for f in figures if isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f)]
    if len(timed) != 3 or min(timed) <= 0:
        problems.append(f"latency p50/p90/p99 {figures} are not positive milliseconds")
    elif not timed[0] <= timed[1] <= timed[2]:
        problems.append(f"latency p50/p90/p99 {figures} are not in order")
    iters = latency.get("iters")
    if not isinstance(iters, int) or isinstance(iters, bool) or iters < 1:
        problems.append(f"latency iters {iters!r} is not a count")
    shape = latency.get("shape", {})
    if not isinstance(shape, dict) or not all(
        isinstance(d, list) and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in d)
        for d in shape.values()
    ):
        problems.append("latency shape is not input name -> dims")
    return problems


def check_device_results(bundle: Path, fetched: Path, *, runner: str, host: str) -> dict[str, Any]:
    """Check the files the device step wrote (copied to ``fetched``) against the bundle built here.

    Returns ``{"validation": ..., "engine": engine.json or None, "engine_sha256": ... or None}``.

    Raises:
        ArtifactIntegrityError: a file is missing, unreadable or disagrees with the bundle (all named).
    """
    manifest = json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))
    plan = json.loads((bundle / manifest.get("plan", "plan.json")).read_text(encoding="utf-8"))
    spec = manifest.get("validation") or {}
    tol = spec.get("tolerance") or {}
    refs = golden_references(bundle / manifest.get("goldens", "goldens.npz"))
    outputs = spec.get("outputs") or sorted({o for _, _, o in refs})
    validation = _read_json(fetched / VALIDATION, VALIDATION, host)
    problems: list[str] = []
    label = str(validation.get("runner", ""))
    if not label.startswith(runner):
        problems.append(f"runner {label!r} is not the {runner} runner asked for")
    if validation.get("precision") != plan.get("precision"):
        problems.append(f"precision {validation.get('precision')!r} is not the plan's {plan.get('precision')!r}")
    if validation.get("tolerance") != tol:
        problems.append("tolerance differs from bundle.json's")
    rows = validation.get("checks")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ArtifactIntegrityError(f"{host}: {VALIDATION} has no list of checks", hint="run the device step again")
    try:  # every figure of the wrong type, named the way the gate would name it
        ReportView.parse({"schema": "edgedeploy-report/1", "parity": {"candidates": [{"checks": rows}]}}, VALIDATION)
    except InputError as exc:
        raise ArtifactIntegrityError(f"{host}: {exc.message}", hint="run the device step again") from None
    wanted = {(p, s, o) for (p, s, o) in refs if o in outputs}
    real = any(p in REAL_DATA_POINTS for p, _, _ in refs)  # the bundle's goldens decide which rows judge agreement
    seen: set[tuple[str, int, str]] = set()
    for row in rows:
        if row.get("sample") is None:  # pooled rows: derived again from the per-golden rows below
            continue
        key = (str(row.get("shape")), int(row["sample"]), str(row.get("output")))
        if key not in wanted or key in seen:
            problems.append(f"row {key[0]}#{key[1]} {key[2]} is {'repeated' if key in seen else 'not a golden'}")
            continue
        seen.add(key)
        judged = judges_agreement(key[0], str(plan.get("precision")), real)
        problems += [f"{key[0]}#{key[1]} {key[2]}: {p}" for p in _row_problems(row, refs[key], tol, judged=judged)]
    missing = sorted(wanted - seen)
    if missing:
        problems.append(
            f"{len(missing)} golden checks missing (first: {missing[0][0]}#{missing[0][1]} {missing[0][2]})"
        )
    problems += _pooled_problems(rows, tol, real)
    problems += _latency_problems(validation.get("latency"), runner)
    all_passed = bool(rows) and all(bool(r.get("passed")) for r in rows)
    if validation.get("status") != ("passed" if all_passed else "failed"):
        problems.append(f"status {validation.get('status')!r} disagrees with its rows")
    engine = engine_sha = None
    if runner == "tensorrt":
        engine_name = plan.get("engine", "model.engine")
        engine = _read_json(fetched / ENGINE_RECORD, ENGINE_RECORD, host)
        if not (fetched / engine_name).is_file():
            raise ArtifactIntegrityError(f"{host}: {engine_name} was not sent back", hint="run the device step again")
        engine_sha = sha256_file(fetched / engine_name)
        onnx_sha = (manifest.get("files") or {}).get(plan.get("onnx"))
        expect = {
            "schema": ENGINE_SCHEMA,
            "engine_sha256": engine_sha,
            "source_onnx_sha256": onnx_sha,
            "target": plan.get("target"),
            "precision": plan.get("precision"),
        }
        problems += [
            f"engine.json {k} is {engine.get(k)!r}, expected {v!r}" for k, v in expect.items() if engine.get(k) != v
        ]
        if validation.get("engine") != engine:
            problems.append("validation.json names another engine than engine.json")
    if problems:
        raise ArtifactIntegrityError(
            f"{host}: the device's result does not match the bundle: "
            + "; ".join(problems[:5])
            + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""),
            hint="nothing was merged; run the device step again on a device you trust",
        )
    return {"validation": validation, "engine": engine, "engine_sha256": engine_sha}
