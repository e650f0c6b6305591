"""Runtime backends as a registry (in the manner of mmdeploy's backend registry).

One :class:`RuntimeBackend` per target runtime says everything the pipeline needs to know about it:
the stage that builds its artifact, its operator preflight, the INT8 Q/DQ flavour it reads, the
validation backends that can run its artifact, how to probe this host for it, and whether its
artifact is built here. Adding a runtime is one module that calls :func:`register`; targets,
stages, preflight, quantization and ``deploy doctor`` look the runtime up instead of testing
``if runtime == ...``.

Plain data (layer 0): code is named by ``"module:attribute"`` and imported on use (:func:`load`),
so this module imports nothing from the layers above it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from edgedeploy.errors import ConfigError


@dataclass(frozen=True)
class RuntimeBackend:
    """What the pipeline needs to know about one target runtime.

    Attributes:
        name: the ``runtime`` value of target profiles.
        build_stage: ``"module:Class"`` of the stage that turns the precision model into the artifact.
        preflight: ``"module:function"`` called as ``f(model_path, target, *, dla_core, precision, module_paths)``
            returning operator findings.
        qdq_flavour: the INT8 Q/DQ flavour its parser reads (a key of ``precision.quantize.QDQ_FLAVOURS``).
        validation_backends: the validation backend kinds (``validate.runners.VALIDATION_KINDS``) the
            validate stage judges its builds with; other kinds' artifacts are not judged.
        probe: ``"module:function"`` returning the runtime's version on this host, or None when absent
            (``deploy doctor`` lists it).
        builds_here: the artifact is built on the host (else a device bundle finishes it on the device).
        needs_version: target profiles must name the runtime's version (``trt_version``).
        readiness: ``"module:function"`` called as ``f(host_environment, target)`` returning a
            ``hostenv.Readiness`` (``deploy doctor``); empty: ready wherever ``probe`` finds a version.
        int8_route: how INT8 reaches its artifact, as ``deploy targets`` lists it (targets with implicit
            INT8 calibration add a calibration cache: "QDQ or calib").
    """

    name: str
    build_stage: str
    preflight: str
    qdq_flavour: str
    validation_backends: tuple[str, ...]
    probe: str
    builds_here: bool
    needs_version: bool = False
    readiness: str = ""
    int8_route: str = "QDQ"


_REGISTRY: dict[str, RuntimeBackend] = {}


def register(backend: RuntimeBackend) -> RuntimeBackend:
    """Add (or replace) a runtime backend; returns it."""
    _REGISTRY[backend.name] = backend
    return backend


def unregister(name: str) -> None:
    """Remove a runtime backend (tests that register a toy runtime clean up with this)."""
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """Registered runtime names."""
    return tuple(_REGISTRY)


def get(name: str) -> RuntimeBackend:
    """The backend registered as ``name``.

    Raises:
        ConfigError: no runtime of that name is registered.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown runtime {name!r}", hint=f"use one of {', '.join(_REGISTRY)} or register it in edgedeploy.runtimes"
        ) from None


def load(ref: str) -> Any:
    """The object a ``"module:attribute"`` reference names (imported now)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def probe(name: str) -> str:
    """The version of runtime ``name`` on this host from its registered probe, ``""`` when absent.

    Raises:
        ConfigError: no runtime of that name is registered.
    """
    found = load(get(name).probe)()
    return str(found) if found else ""


register(
    RuntimeBackend(
        name="onnxruntime",
        build_stage="edgedeploy.stages.build_ort:OrtModelFromOnnx",
        preflight="edgedeploy.onnxtools.opsupport:onnxruntime_preflight",
        qdq_flavour="onnxruntime",
        # tensorrt: reported as skipped ("no TensorRT" / no engine), so a policy requiring it fails by name
        validation_backends=("torchscript", "onnxruntime", "tensorrt"),
        probe="edgedeploy.onnxtools.ort:onnxruntime_version",
        builds_here=True,
        readiness="edgedeploy.onnxtools.ort:onnxruntime_readiness",
        int8_route="QDQ (ORT)",
    )
)
register(
    RuntimeBackend(
        name="tensorrt",
        build_stage="edgedeploy.stages.build_trt:BundleFromOnnx",
        preflight="edgedeploy.onnxtools.opsupport:tensorrt_preflight",
        qdq_flavour="tensorrt",
        validation_backends=("torchscript", "onnxruntime", "tensorrt"),
        probe="edgedeploy.trt.adapter:tensorrt_version",
        builds_here=False,
        needs_version=True,
        readiness="edgedeploy.trt.hostcheck:tensorrt_readiness",
        int8_route="QDQ only",
    )
)
