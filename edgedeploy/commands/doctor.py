"""``deploy doctor``: what this machine (or build container) has, and which targets it can build.

It probes the runtimes and tools the pipeline uses (torch, every registered runtime through its
probe, ONNX Runtime's execution providers, TensorRT's Python module, ``trtexec``, NVIDIA GPUs,
Jetson, torch2trt), then says per target profile, by its runtime's registered readiness, whether
the final artifact is built here or only the device bundle is written.
``--require TARGET`` turns it into a preflight gate (exit 4 when a target's artifact cannot be
built here), e.g. as the first step of a self-hosted Jetson CI job.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgedeploy import runtimes
from edgedeploy._version import __version__
from edgedeploy.errors import TargetCapabilityError
from edgedeploy.hostenv import Gpu, HostEnvironment, Readiness, runtime_installed
from edgedeploy.targets import TargetProfile, all_targets, get_target

__all__ = ["Gpu", "HostEnvironment", "TargetReadiness", "probe_host", "target_readiness"]

# platform.machine() spellings → the arch names target profiles use.
_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
# Where JetPack and the NGC TensorRT images keep trtexec when it is not on PATH.
_TRTEXEC_DIRS = ("/usr/src/tensorrt/bin", "/opt/tensorrt/bin", "/workspace/tensorrt/bin")
_JETSON_MODEL_FILE = Path("/proc/device-tree/model")


@dataclass(frozen=True)
class TargetReadiness:
    """Whether a target's final artifact can be built on this host, and if not, every reason why."""

    target: str
    runtime: str
    artifact_here: bool
    what: str
    reasons: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def normalize_arch(machine: str) -> str:
    """``platform.machine()`` → the arch spelling of target profiles (``x86_64``, ``aarch64``)."""
    return _ARCH_ALIASES.get(machine.lower(), machine.lower())


def _package_version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


def _probe_torch() -> tuple[str, bool]:
    try:
        import torch
    except ImportError:
        return "", False
    return str(torch.__version__), bool(torch.cuda.is_available())


def _probe_onnxruntime() -> tuple[str, tuple[str, ...]]:
    try:
        import onnxruntime as ort
    except ImportError:
        return "", ()
    return str(ort.__version__), tuple(ort.get_available_providers())


def _probe_tensorrt() -> tuple[str, str]:
    """TensorRT's version, or "" and a note saying why there is none."""
    from edgedeploy.trt import adapter

    try:
        trt = adapter.import_tensorrt()
    except adapter.TensorRTUnavailable as exc:
        return "", str(exc) if _package_version("tensorrt") else ""
    version = getattr(trt, "__version__", "")
    if not version:  # tensorrt-stubs alone leave a namespace package with no libraries behind it
        return "", "a 'tensorrt' module exists but has no __version__ (type stubs only, no TensorRT libraries)"
    return str(version), ""


def _probe_nvidia_smi() -> list[Gpu]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        res = subprocess.run(
            [exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if res.returncode != 0:
        return []
    return parse_nvidia_smi(res.stdout)


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """GPUs from ``nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader`` output."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, cap = line.rpartition(",")
        if not name:  # an old driver without compute_cap prints the name only
            name, cap = cap, ""
        cap = cap.strip()
        gpus.append(Gpu(name.strip(), cap if cap.replace(".", "").isdigit() else ""))
    return gpus


def _find_trtexec() -> str:
    found = shutil.which("trtexec")
    if found:
        return found
    for folder in _TRTEXEC_DIRS:
        candidate = Path(folder) / "trtexec"
        if candidate.is_file():
            return str(candidate)
    return ""


def _jetson_model() -> str:
    try:
        model = _JETSON_MODEL_FILE.read_bytes().decode("utf-8", "replace").strip("\x00\n ")
    except OSError:
        return ""
    return model if "jetson" in model.lower() else ""


def probe_host() -> HostEnvironment:
    """Probe this machine. Never raises for a missing component: absence is what it reports."""
    from edgedeploy.trt import adapter

    torch_version, torch_cuda = _probe_torch()
    ort_version, providers = _probe_onnxruntime()
    trt_version, trt_note = _probe_tensorrt()
    gpus = _probe_nvidia_smi()
    if not gpus:  # Jetson's iGPU is not listed by nvidia-smi on every JetPack; libcudart still sees it
        device = adapter.cuda_device()
        gpus = [Gpu(device["name"], device["sm"])] if device else []
    torch2trt = False
    if torch_version:
        from importlib.util import find_spec

        torch2trt = find_spec("torch2trt") is not None
    return HostEnvironment(
        arch=normalize_arch(platform.machine()),
        python=platform.python_version(),
        torch_version=torch_version,
        torch_cuda=torch_cuda,
        onnxruntime_version=ort_version,
        ort_providers=providers,
        tensorrt_version=trt_version,
        trtexec=_find_trtexec(),
        gpus=tuple(gpus),
        jetson_model=_jetson_model(),
        torch2trt=torch2trt,
        notes=(trt_note,) if trt_note else (),
        runtimes=tuple((name, _probe_runtime(name)) for name in runtimes.names()),
    )


def _probe_runtime(name: str) -> str:
    """Runtime ``name``'s registered probe; a probe that breaks reports the runtime absent, like a missing one."""
    try:
        return runtimes.probe(name)
    except Exception:  # a third-party probe must not take doctor down: absence is what doctor reports
        return ""


def target_readiness(env: HostEnvironment, target: TargetProfile) -> TargetReadiness:
    """Can ``target``'s final artifact be built on ``env``? Its runtime's registered ``readiness`` judges
    (``edgedeploy.runtimes``: ONNX Runtime needs its CPU provider; TensorRT the target's TensorRT version,
    arch and GPU, else only the device bundle is written here); a runtime without one is ready where its
    probe found it.
    """
    backend = runtimes.get(target.runtime)
    judge = runtimes.load(backend.readiness) if backend.readiness else runtime_installed
    verdict: Readiness = judge(env, target)
    return TargetReadiness(target.name, target.runtime, not verdict.reasons, verdict.what, tuple(verdict.reasons))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="report the runtimes and tools found here and which targets build here")
    p.add_argument("--targets-file", default=None, help="extra target profiles (TOML)")
    p.add_argument(
        "--require",
        action="append",
        default=[],
        metavar="TARGET",
        help="exit 4 unless TARGET's final artifact can be built here (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=run)


def _print_text(env: HostEnvironment, readiness: list[TargetReadiness]) -> None:
    def show(label: str, value: str) -> None:
        print(f"  {label:<12} {value}")

    print(f"edgedeploy {__version__} on {platform.system()} {env.arch}, Python {env.python}")
    show("torch", f"{env.torch_version} (CUDA: {'yes' if env.torch_cuda else 'no'})" if env.torch_version else "-")
    for name in runtimes.names():  # every registered runtime, as its probe found it
        show(name, env.runtime_version(name) or "not installed")
    show("ORT EPs", ", ".join(env.ort_providers) or "-")
    show("trtexec", env.trtexec or "not found")
    gpus = ", ".join(f"{g.name} (SM {g.sm or '?'})" for g in env.gpus)
    show("GPU", gpus or "none found")
    show("Jetson", env.jetson_model or "no")
    show("torch2trt", "installed" if env.torch2trt else "not installed")
    for note in env.notes:
        print(f"  note: {note}")
    print()
    print(f"{'target':<18} {'runtime':<12} here")
    for r in readiness:
        why = f": {'; '.join(r.reasons)}" if r.reasons else ""
        print(f"{r.target:<18} {r.runtime:<12} {r.what}{why}")


def run(args: argparse.Namespace) -> int:
    """Print the report; with ``--require``, fail once listing every required target not buildable here.

    Raises:
        ConfigError: unknown ``--require`` target or bad ``--targets-file``.
        TargetCapabilityError: a required target's final artifact cannot be built on this machine.
    """
    targets = all_targets(args.targets_file)
    required = [get_target(name, args.targets_file) for name in args.require]  # unknown name: ConfigError first
    env = probe_host()
    readiness = [target_readiness(env, t) for t in targets.values()]
    by_name = {r.target: r for r in readiness}
    if args.json:
        print(json.dumps({"host": env.to_dict(), "targets": {r.target: r.to_dict() for r in readiness}}, indent=2))
    else:
        _print_text(env, readiness)
    missing = [by_name[t.name] for t in required if not by_name[t.name].artifact_here]
    if missing:
        detail = "; ".join(f"{r.target}: {', '.join(r.reasons)}" for r in missing)
        sys.stdout.flush()
        raise TargetCapabilityError(
            f"cannot build the final artifact for {', '.join(r.target for r in missing)} here ({detail})",
            hint="run on the target device or in its build image (see docs/docker.md)",
        )
    return 0
