"""Whether a TensorRT target's engine can be built on this host (``deploy doctor``), from probed facts only."""

from __future__ import annotations

from edgedeploy.hostenv import HostEnvironment, Readiness
from edgedeploy.targets import TargetProfile


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def tensorrt_readiness(env: HostEnvironment, target: TargetProfile) -> Readiness:
    """TensorRT's verdict: engines are tied to the TensorRT version (major.minor) and to the GPU, so an
    engine is built only where the target's TensorRT version, CPU arch and (when the profile fixes one)
    compute capability are all present; anywhere else the build writes a device bundle that finishes the
    engine on the device.
    """
    reasons: list[str] = []
    if not env.tensorrt_version:
        reasons.append("TensorRT (Python module) not installed")
    elif _major_minor(env.tensorrt_version) != _major_minor(target.trt_version):
        reasons.append(f"TensorRT {env.tensorrt_version} here, target needs {target.trt_version}")
    if env.arch != target.arch:
        reasons.append(f"host is {env.arch}, target is {target.arch}")
    if not env.gpus:
        reasons.append("no NVIDIA GPU found")
    elif target.sm and target.sm not in {g.sm for g in env.gpus}:
        have = ", ".join(f"{g.name} (SM {g.sm or '?'})" for g in env.gpus)
        reasons.append(f"target needs SM {target.sm}, found {have}")
    what = "TensorRT engine built here" if not reasons else "device bundle only (engine built on the device)"
    return Readiness(what, tuple(reasons))
