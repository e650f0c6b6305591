"""A device step's checked results merged into a finished output folder, so ``deploy gate`` judges them.

The fetched files go into ``OUT/bundle/`` beside the bundle (``validation.json``, and with TensorRT
``engine.json`` and the engine), the device's rows become parity candidates in ``report.json`` (its report
formats are rewritten), its latency a ``latency.backends`` row, and ``manifest.json`` lists the new files
and the rewritten reports with their sha256, so the gate's integrity and binding checks cover them. A
``release.sig`` written before no longer covers the folder: sign it again (``deploy sign``).

Candidates: ``tensorrt`` (the deployed engine, with the device's GPU and TensorRT) when the TensorRT runner
ran; with ``--runner onnxruntime`` the rows are ``onnxruntime@device`` (the bundle's ONNX model run by
ONNX Runtime on the device) and ``tensorrt`` stays skipped, saying why: no engine was built.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from edgedeploy.artifacts import MANIFEST, REPORT
from edgedeploy.fileio.hashing import sha256_file
from edgedeploy.fileio.store import atomic_write_json
from edgedeploy.pipeline.report import summarize, write_report_files
from edgedeploy.remote.step import DeviceOutcome

STAND_IN = "onnxruntime@device"
ENGINE_CANDIDATE = "tensorrt"
SIGNATURE = "release.sig"


def device_candidates(outcome: DeviceOutcome, bundle_prefix: str) -> list[dict[str, Any]]:
    """Report candidates for one device's validation (see the module docstring)."""
    validation = outcome.checked["validation"]
    engine = outcome.checked.get("engine") or {}
    about = {"host": outcome.host.label, "runner": validation.get("runner"), "python": engine.get("python")}
    if engine:
        about.update(tensorrt=engine.get("tensorrt"), gpu=engine.get("gpu"))
    cand: dict[str, Any] = {
        "backend": "tensorrt" if outcome.runner == "tensorrt" else "onnxruntime",
        "status": validation.get("status"),
        "precision": validation.get("precision"),
        "checks": [{"check": "parity", **row} for row in validation.get("checks", [])],
        "device": {k: v for k, v in about.items() if v},
    }
    if outcome.runner == "tensorrt":
        engine_name = f"{bundle_prefix}{engine.get('engine', 'model.engine')}"
        return [
            {
                "name": ENGINE_CANDIDATE,
                "deploy": True,
                "artifact": engine_name,
                "sha256": outcome.checked["engine_sha256"],
                **cand,
            }
        ]
    skipped = {
        "name": ENGINE_CANDIDATE,
        "status": "skipped",
        "reason": f"no engine built: the device step on {outcome.host.label} ran the ONNX Runtime stand-in "
        "(--runner onnxruntime)",
        "checks": [],
    }
    return [{"name": STAND_IN, "deploy": False, **cand}, skipped]


def merge_device_outcome(out: Path, outcome: DeviceOutcome) -> dict[str, Any]:
    """Move ``outcome``'s files into ``out``'s bundle and merge its rows into report.json and manifest.json.

    Returns the new report.
    """
    report = json.loads((out / REPORT).read_text(encoding="utf-8"))
    manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    artifact = str(report["model"]["artifact"])
    prefix = artifact.rsplit("/", 1)[0] + "/" if "/" in artifact else ""
    bundle = out / prefix
    new = device_candidates(outcome, prefix)
    names = {c["name"] for c in new}
    parity = dict(report.get("parity") or {})
    candidates = [c for c in parity.get("candidates", []) if c.get("name") not in names] + new
    failed = [c["name"] for c in candidates if c.get("status") == "failed"]
    engine = next(c for c in candidates if c["name"] == ENGINE_CANDIDATE)
    if failed:
        parity.update(status="failed", reason=f"failed on the device: {', '.join(failed)}")
    elif engine.get("status") == "passed":
        parity.update(status="passed", reason=None)
    else:
        parity.update(status="skipped", reason=engine.get("reason"))
    parity["candidates"] = candidates
    if parity["status"] in ("passed", "failed"):
        parity["reference"] = "pytorch-eager"  # the bundle's goldens are the PyTorch model's outputs
    report["parity"] = {k: v for k, v in parity.items() if v is not None}
    latency = (outcome.checked["validation"] or {}).get("latency")
    if outcome.runner != "tensorrt" and ENGINE_CANDIDATE in ((report.get("latency") or {}).get("backends") or {}):
        # an earlier engine's timing does not belong to this run's (stand-in) result
        report["latency"] = {"status": "skipped", "reason": engine.get("reason")}
    if outcome.runner == "tensorrt" and latency:
        timed = {k: float(latency[k]) for k in ("p50_ms", "p90_ms", "p99_ms")}
        shapes = latency.get("shape") or {}
        batch = next((int(dims[0]) for dims in shapes.values() if dims), 1)
        row: dict[str, Any] = {**timed, "throughput": batch * 1000.0 / timed["p50_ms"] if timed["p50_ms"] > 0 else 0.0}
        # complete_bundle.py times after 3 warm-up runs, host-side (copies to and from the device included)
        row.update(batch=batch, iters=int(latency.get("iters") or 0), warmup=3, shape=shapes, device=outcome.host.label)
        report["latency"] = {"status": "measured", "shape": "opt", "backends": {ENGINE_CANDIDATE: row}}
    report["device"] = {
        "host": outcome.host.label,
        "runner": outcome.runner,
        "exit_code": outcome.exit_code,
        "completed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    report["summary"] = summarize({"parity": report["parity"]})
    for name in outcome.files:  # the new report is made: only now the files move in
        os.replace(outcome.staging / name, bundle / name)
    written = write_report_files(report, out)
    artifacts = dict(manifest.get("artifacts") or {})
    for name in [*(f"{prefix}{n}" for n in outcome.files), *written]:
        artifacts[name] = sha256_file(out / name)
    manifest["artifacts"] = artifacts
    manifest["summary"] = report["summary"]
    atomic_write_json(out / MANIFEST, manifest)
    return report
