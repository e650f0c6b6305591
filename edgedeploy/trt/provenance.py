"""Engine provenance (``engine.json``) and the checks made before any engine is deserialized.

The record format and the compatibility rules live in the device module (they run on the device
too); this module gives them edgedeploy's errors and reads what is running here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgedeploy.device import complete_bundle as device
from edgedeploy.errors import ArtifactIntegrityError, EngineCompatibilityError, InputError
from edgedeploy.fileio.hashing import sha256_file

ENGINE_RECORD = device.ENGINE_RECORD
engine_record = device.engine_record


def read_engine_record(engine: Path) -> dict[str, Any]:
    """The ``engine.json`` beside ``engine``.

    Raises:
        InputError: the engine or its record is missing or unreadable.
    """
    if not engine.is_file():
        raise InputError(
            f"engine not found: {engine}",
            hint="give the path of a model.engine that deploy bundle complete or deploy device run wrote "
            "(OUT/bundle/model.engine)",
        )
    path = engine.parent / ENGINE_RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(
            f"no readable {ENGINE_RECORD} beside {engine} ({exc})",
            hint="engines built by complete_bundle.py carry one; without it the engine's origin is unknown",
        ) from None
    if record.get("schema") != device.ENGINE_SCHEMA:
        raise InputError(f"{path} is not an edgedeploy engine record (schema {record.get('schema')!r})")
    return record


def running_tensorrt() -> tuple[str | None, dict[str, str] | None]:
    """TensorRT version and CUDA device (name, SM) of this machine; None for what is absent."""
    from edgedeploy.trt import adapter

    return adapter.tensorrt_version(), adapter.cuda_device()


def verify_engine_file(engine: Path, record: dict[str, Any]) -> str:
    """Check the engine's sha256 against its record before anything deserializes it; returns the hash.

    Raises:
        ArtifactIntegrityError: the bytes differ (a tampered or replaced engine).
    """
    got = sha256_file(engine)
    if got != record.get("engine_sha256"):
        raise ArtifactIntegrityError(
            f"{engine}: sha256 {got[:16]}... differs from {ENGINE_RECORD} ({str(record.get('engine_sha256'))[:16]}...)",
            hint="engines are executable artifacts: rebuild it rather than load it",
        )
    return got


def check_compatibility(record: dict[str, Any], trt_version: str | None, gpu: dict[str, str] | None) -> None:
    """Compare an engine's record with a TensorRT version and GPU.

    Raises:
        EngineCompatibilityError: built for another TensorRT release or GPU SM (both sides named).
    """
    problems = device.compat_problems(record, trt_version, gpu)
    if problems:
        raise EngineCompatibilityError(
            "; ".join(problems), hint="rebuild the engine where it runs: python3 -I complete_bundle.py <bundle>"
        )


def check_engine(engine: Path, *, trt_version: str | None = None, sm: str | None = None) -> dict[str, Any]:
    """Everything checked before loading ``engine``: record, sha256, TensorRT and GPU.

    ``trt_version`` / ``sm`` stand for the machine that will load it; by default the running one.

    Raises:
        InputError: no engine or record.
        ArtifactIntegrityError: the engine's hash differs from its record.
        EngineCompatibilityError: it will not load on that TensorRT / GPU.
    """
    record = read_engine_record(engine)
    verify_engine_file(engine, record)
    if trt_version is None and sm is None:
        running_trt, gpu = running_tensorrt()
    else:
        running_trt, gpu = trt_version, ({"name": "", "sm": sm} if sm else {"name": "", "sm": ""})
    check_compatibility(record, running_trt, gpu)
    return record
