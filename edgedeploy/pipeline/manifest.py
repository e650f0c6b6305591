"""manifest.json: what went in, what came out (sha256), which tools made it, how long it took."""

from __future__ import annotations

import platform
from datetime import datetime, timezone
from importlib import metadata
from typing import Any

from edgedeploy.artifacts import MANIFEST
from edgedeploy.fileio.integrity import read_manifest, verify_artifacts

__all__ = ["MANIFEST", "SCHEMA", "build_manifest", "read_manifest", "tool_versions", "verify_artifacts"]
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
