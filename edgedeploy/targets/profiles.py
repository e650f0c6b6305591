"""Built-in target profiles, composed from base profiles with ``dataclasses.replace``.

Facts (TensorRT / CUDA / SM / Python per JetPack, ONNX opset per TensorRT) follow NVIDIA's
JetPack and TensorRT release notes and support matrices; docs/targets.md cites each one.
Where a profile covers several modules (AGX / NX), memory and DLA count are the smallest
module's, so a plan that fits the profile fits every module it names.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgedeploy.errors import ConfigError, TargetCapabilityError
from edgedeploy.schema import read_toml

IMPLICIT_INT8_DEPRECATED = (10, 1)  # TensorRT release notes 10.1: implicit quantization deprecated
Runtime = str  # a registered runtime (edgedeploy.runtimes): onnxruntime, tensorrt, or one a plugin adds


@dataclass(frozen=True)
class TargetProfile:
    """What one deployment target is and can do.

    Attributes:
        name: the id used with ``--target``.
        runtime: ``onnxruntime`` (built here) or ``tensorrt`` (engine built where TensorRT runs).
        arch: CPU architecture of the device (x86_64, aarch64).
        precisions: precisions this target runs fast and correctly.
        trt_version: TensorRT version the device ships ("" for onnxruntime targets).
        cuda_version: CUDA version the device ships.
        sm: GPU compute capability, e.g. "8.7" ("" when it varies or there is no GPU).
        dla_cores: number of DLA cores (0: none).
        max_opset: highest ONNX opset the target's parser / runtime accepts.
        default_opset: opset exported when the config names none (0: ``max_opset``). Lower than
            the ceiling where an op new at a higher opset has no importer in this parser while
            the exporter decomposes it below that opset (see :attr:`export_opset`).
        workspace_mib: default builder workspace limit.
        memory_mib: device memory (shared with the CPU on Jetson).
        device_python: Python version on the device (bundle scripts must run on it).
        jetpack: JetPack release ("" for non-Jetson).
        implicit_int8: calibrator-based (implicit) INT8 is built for this target: TensorRT 8.x only.
            NVIDIA deprecated it in TensorRT 10.1 and removed it in 11; from 10.1 on INT8 is explicit
            (a Q/DQ model) and no calibration cache is written (:attr:`explicit_int8_only`).
        strongly_typed_only: TensorRT has no builder precision flags (TRT >= 11).
    """

    name: str
    description: str
    runtime: Runtime
    arch: str = "x86_64"
    precisions: tuple[str, ...] = ("fp32",)
    trt_version: str = ""
    cuda_version: str = ""
    sm: str = ""
    dla_cores: int = 0
    max_opset: int = 17
    default_opset: int = 0
    workspace_mib: int = 1024
    memory_mib: int = 0
    device_python: str = ""
    jetpack: str = ""
    implicit_int8: bool = False
    strongly_typed_only: bool = False

    @property
    def trt_major(self) -> int:
        """TensorRT major version (0 for onnxruntime targets)."""
        head = self.trt_version.split(".")[0]
        return int(head) if head.isdigit() else 0

    @property
    def trt_release(self) -> tuple[int, int]:
        """(major, minor) of the TensorRT version; (0, 0) for onnxruntime targets."""
        parts = (self.trt_version.split(".") + ["0"])[:2]
        return (int(parts[0]), int(parts[1])) if all(p.isdigit() for p in parts) else (0, 0)

    @property
    def explicit_int8_only(self) -> bool:
        """TensorRT >= 10.1: implicit (calibrator) INT8 is deprecated there, so INT8 is Q/DQ only."""
        return self.trt_release >= IMPLICIT_INT8_DEPRECATED

    @property
    def export_opset(self) -> int:
        """The opset exported by default: ``default_opset`` or else the ceiling."""
        return self.default_opset or self.max_opset

    @property
    def strongly_typed(self) -> bool:
        """TensorRT builds strongly typed networks (the model's types decide precision): TRT >= 10."""
        return self.trt_major >= 10

    @property
    def builds_here(self) -> bool:
        """True when the artifact is built on this host (no TensorRT needed)."""
        from edgedeploy import runtimes

        return runtimes.get(self.runtime).builds_here

    def supports_precision(self, precision: str) -> bool:
        return precision in self.precisions

    def require_precision(self, precision: str) -> None:
        """Raise unless this target runs ``precision``.

        Raises:
            TargetCapabilityError: the target cannot run the precision; nothing is downgraded.
        """
        if precision not in self.precisions:
            raise TargetCapabilityError(
                f"target '{self.name}' cannot run {precision} (it supports {', '.join(self.precisions)})",
                hint=f"use --precision {self.precisions[-1]} or another target",
            )

    def require_dla(self, core: int | None, precision: str | None = None) -> None:
        """Raise unless DLA core ``core`` exists on this target (``None``: no DLA asked).

        With ``precision``, also refuse FP32 on DLA: DLA runs FP16 and INT8 layers only, so an
        FP32 build would silently run every layer on the GPU fallback.

        Raises:
            TargetCapabilityError: the target has no DLA, not that many cores, or DLA cannot run the precision.
        """
        if core is None:
            return
        if self.dla_cores == 0:
            raise TargetCapabilityError(
                f"target '{self.name}' has no DLA cores (asked for DLA core {core})",
                hint="drop --dla-core or pick a target with DLA (jetson-orin, jetson-xavier)",
            )
        if not 0 <= core < self.dla_cores:
            cores = " or ".join(f"--dla-core {c}" for c in range(self.dla_cores))
            raise TargetCapabilityError(
                f"target '{self.name}' has DLA cores 0..{self.dla_cores - 1}, asked for core {core}",
                hint=f"use {cores} (build.dla_core)",
            )
        if precision == "fp32":
            raise TargetCapabilityError(
                f"DLA on target '{self.name}' runs FP16 and INT8 layers only; an fp32 build would run on the GPU",
                hint="use --precision fp16 or int8 with --dla-core, or drop --dla-core",
            )

    def problems(self) -> list[str]:
        """What is inconsistent in this profile (for user profiles read from a file)."""
        out = []
        bad = [p for p in self.precisions if p not in ("fp32", "fp16", "int8")]
        if bad or not self.precisions:
            out.append(f"precisions {list(self.precisions)} must be a non-empty subset of fp32, fp16, int8")
        from edgedeploy import runtimes

        if self.runtime not in runtimes.names():
            out.append(f"runtime {self.runtime!r} must be one of {', '.join(runtimes.names())}")
        elif runtimes.get(self.runtime).needs_version and self.trt_major == 0:
            out.append(f"trt_version {self.trt_version!r} must be a TensorRT version like '10.3'")
        if self.default_opset and not 0 < self.default_opset <= self.max_opset:
            out.append(f"default_opset {self.default_opset} must be within 1..max_opset ({self.max_opset})")
        if self.dla_cores < 0 or self.workspace_mib <= 0 or self.memory_mib < 0:
            out.append("dla_cores and memory_mib must be >= 0 and workspace_mib > 0")
        if self.memory_mib and self.workspace_mib > self.memory_mib:
            out.append(f"workspace_mib {self.workspace_mib} exceeds memory_mib {self.memory_mib}")
        if self.strongly_typed_only and self.implicit_int8:
            out.append("strongly_typed_only targets (TensorRT >= 11) have no implicit_int8")
        elif self.implicit_int8 and self.explicit_int8_only:
            out.append(
                f"implicit_int8 is for TensorRT 8.x; TensorRT {self.trt_version} takes explicit Q/DQ INT8 only "
                "(implicit INT8 is deprecated from 10.1): drop implicit_int8"
            )
        return out

    def capabilities(self) -> dict[str, object]:
        """Plain-data view for ``deploy targets`` and the manifest."""
        data = dataclasses.asdict(self)
        data["builds_here"] = self.builds_here
        return data


# ---- base profiles -----------------------------------------------------------------

_CPU = TargetProfile(
    name="cpu",
    description="x86_64/aarch64 CPU with ONNX Runtime (built and validated here)",
    runtime="onnxruntime",
    precisions=("fp32", "int8"),
    max_opset=21,
)
_TRT_BASE = TargetProfile(
    name="_trt", description="TensorRT base", runtime="tensorrt", precisions=("fp32", "fp16", "int8")
)
_JETSON_BASE = dataclasses.replace(_TRT_BASE, name="_jetson", arch="aarch64", workspace_mib=512)

_DESKTOP = dataclasses.replace(
    _TRT_BASE,
    name="desktop",
    description="x86_64 desktop/server NVIDIA GPU, TensorRT 10.13 (engine built where the GPU is)",
    trt_version="10.13",
    cuda_version="13.0",  # NGC TensorRT 25.08 image (docker/images.toml); 10.13 also ships for CUDA 12.9
    sm="",  # any desktop GPU; the engine records the SM it was built on
    max_opset=22,  # conservative: 10.9+ parses opset 22 (later 10.x go higher)
    workspace_mib=4096,
    device_python="3.12",  # the desktop image (NGC TensorRT 25.08, Ubuntu 24.04) runs the device step
    implicit_int8=False,  # deprecated from TensorRT 10.1: explicit Q/DQ only
)
_DESKTOP_TRT11 = dataclasses.replace(
    _DESKTOP,
    name="desktop-trt11",
    description="x86_64 NVIDIA GPU, TensorRT 11.5 (strongly typed networks only; no FP16/INT8 builder flags)",
    trt_version="11.5",
    cuda_version="13.5",
    implicit_int8=False,
    strongly_typed_only=True,
    max_opset=25,
)
_JETSON_ORIN = dataclasses.replace(
    _JETSON_BASE,
    name="jetson-orin",
    description="Jetson AGX Orin / Orin NX 16GB, JetPack 6.2 (2 DLA cores; Orin NX 8GB has 1)",
    jetpack="6.2",
    trt_version="10.3",
    cuda_version="12.6",
    sm="8.7",
    dla_cores=2,
    max_opset=20,
    memory_mib=16384,  # Orin NX 16GB; AGX Orin has 32/64 GB
    workspace_mib=1024,
    device_python="3.10",
    implicit_int8=False,  # TensorRT 10.3: explicit Q/DQ only (implicit INT8 deprecated from 10.1)
)
_JETSON_ORIN_NANO = dataclasses.replace(
    _JETSON_ORIN,
    name="jetson-orin-nano",
    description="Jetson Orin Nano 8GB, JetPack 6.2 (no DLA)",
    dla_cores=0,
    memory_mib=8192,
    workspace_mib=256,
)
_JETSON_XAVIER = dataclasses.replace(
    _JETSON_BASE,
    name="jetson-xavier",
    description="Jetson AGX Xavier / Xavier NX, JetPack 5.1 (2 DLA cores)",
    jetpack="5.1",
    trt_version="8.5",
    cuda_version="11.4",
    sm="7.2",
    dla_cores=2,
    max_opset=17,
    # TensorRT 8.5 reads opset 17 but has no LayerNormalization importer (added in 8.6: onnx-tensorrt
    # Changelog "8.6 EA"; absent from builtin_op_importers.cpp on 8.5-GA). torch emits
    # LayerNormalization at opset 17 and decomposes it at 16, so export 16 by default.
    default_opset=16,
    memory_mib=8192,  # Xavier NX 8GB; AGX Xavier has 32/64 GB
    device_python="3.8",
    implicit_int8=True,
)
_JETSON_NANO = dataclasses.replace(
    _JETSON_BASE,
    name="jetson-nano",
    description="Jetson Nano 4GB, JetPack 4.6.1+ (Maxwell: FP16 but no fast INT8, no DLA)",
    jetpack="4.6.1",  # JetPack 4.6 itself ships TensorRT 8.0.1; 4.6.1 and later ship 8.2.1
    trt_version="8.2",
    cuda_version="10.2",
    sm="5.3",
    precisions=("fp32", "fp16"),
    max_opset=13,
    memory_mib=4096,
    workspace_mib=256,
    device_python="3.6",
    implicit_int8=False,  # no INT8 at all on SM 5.3
)

BUILTIN_TARGETS: dict[str, TargetProfile] = {
    t.name: t for t in (_CPU, _DESKTOP, _DESKTOP_TRT11, _JETSON_ORIN, _JETSON_ORIN_NANO, _JETSON_XAVIER, _JETSON_NANO)
}


def load_target_file(path: str | Path) -> dict[str, TargetProfile]:
    """Read user target profiles from a TOML file.

    Each ``[targets.NAME]`` table may name ``base = "jetson-orin"`` and override any field.

    Raises:
        ConfigError: missing file, bad TOML, unknown base or unknown / mistyped field.
    """
    path = Path(path)
    doc = read_toml(path, what="targets file")
    hints = typing.get_type_hints(TargetProfile)
    names = [f.name for f in dataclasses.fields(TargetProfile)]
    out: dict[str, TargetProfile] = {}
    for name, table in (doc.get("targets") or {}).items():
        table = dict(table)
        base_name = table.pop("base", None)
        known = {**BUILTIN_TARGETS, **out}
        if base_name is None:
            base = dataclasses.replace(_TRT_BASE, description=f"user profile {name}")
        elif base_name in known:
            base = known[base_name]
        else:
            raise ConfigError(
                f"{path}: targets.{name}.base = {base_name!r} is not a known target",
                hint=f"use one of {', '.join(known)}",
            )
        for key, value in table.items():
            if key not in names or key == "name":
                close = difflib.get_close_matches(key, names, n=1)
                raise ConfigError(
                    f"{path}: unknown key 'targets.{name}.{key}'", hint=f"did you mean '{close[0]}'?" if close else None
                )
            want = hints[key]
            if typing.get_origin(want) is tuple:
                value = tuple(value) if isinstance(value, list) else value
            ok_types = (
                (str,)
                if typing.get_origin(want) is Literal
                else ((tuple,) if typing.get_origin(want) is tuple else (want,))
            )
            if not isinstance(value, ok_types) or isinstance(value, bool) and want is not bool:
                raise ConfigError(f"{path}: key 'targets.{name}.{key}' has the wrong type ({value!r})")
            table[key] = value
        profile = dataclasses.replace(base, name=name, **table)
        problems = profile.problems()
        if problems:
            raise ConfigError(f"{path}: targets.{name}: " + "; ".join(problems))
        out[name] = profile
    return out


def all_targets(targets_file: str | Path | None = None) -> dict[str, TargetProfile]:
    """Built-in profiles plus those of ``targets_file`` (user profiles win on name clashes)."""
    targets = dict(BUILTIN_TARGETS)
    if targets_file:
        targets.update(load_target_file(targets_file))
    return targets


def get_target(name: str, targets_file: str | Path | None = None) -> TargetProfile:
    """Look a target up by name.

    Raises:
        ConfigError: no profile has that name (with the closest match).
    """
    targets = all_targets(targets_file)
    if name in targets:
        return targets[name]
    close = difflib.get_close_matches(name, list(targets), n=1)
    raise ConfigError(
        f"unknown target {name!r}", hint=f"did you mean '{close[0]}'?" if close else f"use one of {', '.join(targets)}"
    )
