"""manifest.json: what went in, what came out (sha256), which tools made it, how long it took."""

from __future__ import annotations

import json
import platform
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from edgedeploy.errors import ArtifactIntegrityError
from edgedeploy.fileio.hashing import sha256_file

MANIFEST = "manifest.json"
SCHEMA = "edgedeploy-manifest/1"
TOOLS = ("torch", "torchvision", "onnx", "onnxruntime", "onnxslim", "polygraphy", "safetensors", "numpy", "tensorrt")


def tool_versions() -> dict[str, str]:
    """Installed versions of the tools that shape an artifact, read without importing them."""
    from edgedeploy._version import __version__

    versions = {"python": platform.python_version(), "edgedeploy": __version__}
    for name in TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def build_manifest(
    *,
    config: dict[str, Any],
    config_sha: str,
    target: dict[str, Any],
    inputs: dict[str, dict[str, str]],
    artifacts: dict[str, str],
    stages: list[dict[str, Any]],
    summary: dict[str, Any],
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "tools": tool_versions(),
        "target": target,
        "config_sha256": config_sha,
        "config": config,
        "inputs": inputs,
        "artifacts": artifacts,
        "stages": stages,
        "summary": summary,
    }


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The manifest in ``folder``, or None when there is none (or it is unreadable)."""
    p = Path(folder) / MANIFEST
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def verify_artifacts(folder: str | Path, manifest: dict[str, Any] | None = None) -> dict[str, str]:
    """Check every artifact the manifest lists against its recorded sha256.

    Returns the name → sha256 map that was verified.

    Raises:
        ArtifactIntegrityError: no manifest, or an artifact is missing or its hash differs
            (all problems listed in one message).
    """
    folder = Path(folder)
    manifest = manifest if manifest is not None else read_manifest(folder)
    if manifest is None:
        raise ArtifactIntegrityError(
            f"{folder}: no readable {MANIFEST}", hint="point at a folder written by 'deploy build'"
        )
    problems = []
    for name, sha in manifest.get("artifacts", {}).items():
        p = folder / name
        if not p.is_file():
            problems.append(f"{name} missing")
        elif sha256_file(p) != sha:
            problems.append(f"{name} sha256 differs from manifest (tampered or replaced)")
    if problems:
        raise ArtifactIntegrityError(
            f"{folder}: " + "; ".join(problems), hint="rebuild with 'deploy build' or restore the original files"
        )
    return dict(manifest.get("artifacts", {}))
