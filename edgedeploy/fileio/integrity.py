"""Reading manifest.json back and checking a folder's artifacts against the sha256 it records.

Here, below the pipeline, so the release gate (``validate.gate``) and the runner share it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgedeploy.artifacts import MANIFEST
from edgedeploy.errors import ArtifactIntegrityError
from edgedeploy.fileio.hashing import sha256_file
from edgedeploy.fileio.outdir import confined
from edgedeploy.jsonread import read_json


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The manifest in ``folder``, or None when there is none (or it is unreadable)."""
    p = Path(folder) / MANIFEST
    try:
        data = read_json(p)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None  # a JSON list or string is no manifest


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
    artifacts = manifest.get("artifacts")
    if not isinstance(artifacts, dict):
        raise ArtifactIntegrityError(f"{folder}: {MANIFEST} has no 'artifacts' map", hint="rebuild with 'deploy build'")
    for name, sha in artifacts.items():
        try:
            p = confined(folder, name)  # a manifest is data: its names never reach outside the folder
        except ArtifactIntegrityError as exc:
            problems.append(exc.message)
            continue
        if not p.is_file():
            problems.append(f"{name} missing")
        elif sha256_file(p) != sha:
            problems.append(f"{name} sha256 differs from manifest (tampered or replaced)")
    if problems:
        raise ArtifactIntegrityError(
            f"{folder}: " + "; ".join(problems), hint="rebuild with 'deploy build' or restore the original files"
        )
    return dict(artifacts)
