"""What a host offers a build, as plain data: GPUs, runtimes found by their probes, tools.

Plain data (layer 0). ``deploy doctor`` fills a :class:`HostEnvironment` by probing the machine
(``commands/doctor.py``); each registered runtime (``edgedeploy.runtimes``) judges from it whether
its artifact is built here (its ``readiness`` function), so the judging needs no probing and is
tested with hand-written environments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgedeploy.targets import TargetProfile


@dataclass(frozen=True)
class Gpu:
    """One CUDA device: its name and compute capability (``"8.7"``; ``""`` when unknown)."""

    name: str
    sm: str = ""


@dataclass(frozen=True)
class HostEnvironment:
    """What ``probe_host`` found. Empty strings mean "absent"; every field is plain data.

    ``runtimes``: each registered runtime's probe result, ``(name, version)`` pairs (``""``: absent).
    """

    arch: str
    python: str
    torch_version: str = ""
    torch_cuda: bool = False
    onnxruntime_version: str = ""
    ort_providers: tuple[str, ...] = ()
    tensorrt_version: str = ""
    trtexec: str = ""
    gpus: tuple[Gpu, ...] = ()
    jetson_model: str = ""
    torch2trt: bool = False
    notes: tuple[str, ...] = ()
    runtimes: tuple[tuple[str, str], ...] | Mapping[str, str] = ()

    def runtime_version(self, name: str) -> str:
        """The version runtime ``name``'s probe found here, ``""`` when absent or not probed."""
        found = self.runtimes if isinstance(self.runtimes, Mapping) else dict(self.runtimes)
        return found.get(name, "")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["runtimes"] = dict(self.runtimes)
        return data


@dataclass(frozen=True)
class Readiness:
    """A runtime's verdict on one target here: what gets built, and every reason the artifact is not."""

    what: str
    reasons: tuple[str, ...] = ()


def runtime_installed(env: HostEnvironment, target: TargetProfile) -> Readiness:
    """The readiness of a runtime that needs nothing but itself: its probe found a version here."""
    version = env.runtime_version(target.runtime)
    if version:
        return Readiness(f"{target.runtime} {version}: artifact built here")
    return Readiness("cannot build here", (f"{target.runtime} not installed (its probe found nothing)",))
