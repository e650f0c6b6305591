"""``--target jetson`` / ``--target desktop``: pick a concrete profile from the machine, or a configured default.

On a Jetson the module comes from ``/proc/device-tree/model`` and the L4T release from
``/etc/nv_tegra_release`` (``# R36 (release), REVISION: 4.3, ...`` -> L4T 36.4.3). L4T maps to the
JetPack and so to the TensorRT the device ships (NVIDIA's JetPack release notes / Jetson archive):

- L4T R32.7.x = JetPack 4.6.1+ (TensorRT 8.2.1); R32.6.1 = JetPack 4.6 (TensorRT 8.0.1, no profile);
- L4T R35.2.1 .. R35.6 = JetPack 5.1.x (TensorRT 8.5.2); R35.1 = JetPack 5.0.2 (TensorRT 8.4.1, no profile);
- L4T R36.4.x = JetPack 6.1 / 6.2 (TensorRT 10.3); R36.2 / R36.3 = JetPack 6.0 (TensorRT 8.6.2, no profile).

The mapping is data (:data:`JETSON_RULES`); a combination without a built-in profile is an error
naming what was found and how to describe it in a targets file. Off a Jetson, ``jetson`` resolves to
``[build] jetson`` (default ``jetson-orin``, the current JetPack's Orin). ``desktop`` uses the local
TensorRT and GPU when both are present (TensorRT >= 11 picks ``desktop-trt11``; the GPU's SM is
recorded), else the ``desktop`` profile as is. Every resolution is said in one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path
from typing import Any

from edgedeploy.errors import ConfigError, TargetCapabilityError
from edgedeploy.targets.profiles import TargetProfile, get_target

DEVICE_TREE_MODEL = Path("/proc/device-tree/model")
NV_TEGRA_RELEASE = Path("/etc/nv_tegra_release")
ALIASES = ("jetson", "desktop")

# (module family, lowest L4T, highest L4T (exclusive), profile); first match wins
JETSON_RULES: tuple[tuple[str, tuple[int, ...], tuple[int, ...], str], ...] = (
    ("nano", (32, 7), (33,), "jetson-nano"),
    ("xavier", (35, 2), (36,), "jetson-xavier"),
    ("orin-nano", (36, 4), (37,), "jetson-orin-nano"),
    ("orin", (36, 4), (37,), "jetson-orin"),
)
# model string patterns -> family, most specific first
_FAMILIES = (
    (re.compile(r"orin\s*nano", re.I), "orin-nano"),
    (re.compile(r"orin", re.I), "orin"),
    (re.compile(r"xavier|jetson-agx|p2888|p3668", re.I), "xavier"),
    (re.compile(r"jetson\s*nano|p3448|p3450", re.I), "nano"),
)


@dataclasses.dataclass(frozen=True)
class JetsonInfo:
    """What a Jetson says about itself."""

    model: str
    family: str
    l4t: tuple[int, ...]

    @property
    def l4t_text(self) -> str:
        return ".".join(map(str, self.l4t)) or "?"


def read_jetson(model_path: Path | None = None, release_path: Path | None = None) -> JetsonInfo | None:
    """The Jetson module and L4T release of this machine, or None when it is not a Jetson.

    The paths default to :data:`DEVICE_TREE_MODEL` and :data:`NV_TEGRA_RELEASE` (read at call time,
    so tests can point them at fakes).
    """
    model_path = model_path or DEVICE_TREE_MODEL
    release_path = release_path or NV_TEGRA_RELEASE
    try:
        model = model_path.read_bytes().replace(b"\0", b"").decode("utf-8", "replace").strip()
    except OSError:
        return None
    family = next((fam for pattern, fam in _FAMILIES if pattern.search(model)), "")
    if not family and "jetson" not in model.lower():
        return None
    l4t: tuple[int, ...] = ()
    try:
        text = release_path.read_text(errors="replace")
        m = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
        if m:
            l4t = (int(m.group(1)), *(int(p) for p in m.group(2).split(".") if p.isdigit()))
    except OSError:
        pass
    return JetsonInfo(model=model, family=family, l4t=l4t)


def jetson_profile_name(info: JetsonInfo) -> str:
    """The built-in profile for a detected Jetson.

    Raises:
        TargetCapabilityError: no built-in profile covers this module and L4T release.
    """
    for family, lo, hi, name in JETSON_RULES:
        if family == info.family and lo <= info.l4t < hi:
            return name
    raise TargetCapabilityError(
        f"this Jetson ({info.model or 'unknown model'}, L4T {info.l4t_text}) has no built-in profile "
        "(built-in: Nano on JetPack 4.6.1+, Xavier on JetPack 5.1, Orin on JetPack 6.1/6.2)",
        hint="describe it in a targets file (base = the closest profile, trt_version = what "
        "`dpkg -l | grep nvinfer` shows) and pass --targets-file, or name a target explicitly",
    )


def resolve_target(
    name: str,
    *,
    targets_file: str | Path | None = None,
    jetson_default: str = "jetson-orin",
    model_path: Path | None = None,
    release_path: Path | None = None,
    local_tensorrt: Any = None,
) -> tuple[TargetProfile, str]:
    """The profile for ``name`` and, for ``jetson`` / ``desktop``, a note saying how it was chosen.

    Args:
        local_tensorrt: for ``desktop``: ``(trt_version or None, {"name", "sm"} or None)``, or a
            function returning that (``edgedeploy.trt.provenance.running_tensorrt`` reads this
            machine; targets sit below trt in the layers, so the caller passes it). None: no detection.

    Raises:
        ConfigError: unknown target name (or a bad ``[build] jetson`` default).
        TargetCapabilityError: a Jetson without a built-in profile.
    """
    if name == "jetson":
        info = read_jetson(model_path, release_path)
        if info is not None:
            chosen = jetson_profile_name(info)
            how = f"detected {info.model} with L4T {info.l4t_text}"
        else:
            chosen = jetson_default
            how = "not on a Jetson: [build] jetson default"
        return _jetson_profile(chosen, targets_file), f" (from 'jetson': {how})"
    if name == "desktop":
        found = local_tensorrt() if callable(local_tensorrt) else local_tensorrt
        version, gpu = found if found is not None else (None, None)
        if version is None or gpu is None:
            return get_target("desktop", targets_file), " (no local TensorRT + GPU detected: desktop profile as is)"
        major = int(version.split(".")[0])
        profile = get_target("desktop-trt11" if major >= 11 else "desktop", targets_file)
        profile = dataclasses.replace(profile, trt_version=".".join(version.split(".")[:2]), sm=gpu.get("sm", ""))
        return profile, f" (from 'desktop': local TensorRT {version} on {gpu.get('name', '?')}, SM {gpu.get('sm')})"
    return get_target(name, targets_file), ""


def _jetson_profile(name: str, targets_file: str | Path | None) -> TargetProfile:
    """The profile ``--target jetson`` resolved to: one with a JetPack release, never a CPU or desktop profile
    (``--jetson cpu`` would otherwise build for a machine that is no Jetson).

    Raises:
        ConfigError: ``name`` is unknown, an alias, or no Jetson profile (the Jetson profiles named).
    """
    from edgedeploy.targets.profiles import all_targets

    targets = all_targets(targets_file)
    jetsons = [n for n, t in targets.items() if t.jetpack]
    profile = targets.get(name)
    if profile is not None and profile.jetpack:
        return profile
    if name in ALIASES:
        problem = f"{name!r} is not a Jetson profile (an alias of --target)"
    elif profile is None:
        problem = f"unknown target {name!r}"
    else:
        problem = f"{name!r} is not a Jetson profile (the {profile.runtime} target for {profile.arch})"
    close = difflib.get_close_matches(name, jetsons, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(
        f"key 'build.jetson' (--jetson): {problem}",
        hint=f"{hint}use one of {', '.join(jetsons)}, or a targets-file profile with a jetpack",
    )


def check_capabilities(target: TargetProfile, cfg: Any) -> None:
    """Everything about the request the target cannot do, before any stage runs (all named at once).

    Precision, DLA core / precision / static shapes (DLA has no dynamic dimensions: NVIDIA's "DLA
    Supported Layers and Restrictions"), and ``export.opset`` above the target's parser.

    Raises:
        TargetCapabilityError: one message listing every problem.
    """
    problems: list[str] = []
    hints: list[str] = []
    for check in (
        lambda: target.require_precision(cfg.precision.mode),
        lambda: target.require_dla(cfg.build.dla_core, cfg.precision.mode),
    ):
        try:
            check()
        except TargetCapabilityError as exc:
            problems.append(exc.message)
            if exc.hint:
                hints.append(exc.hint)
    if cfg.build.dla_core is not None and target.dla_cores:
        dynamic = [s.name for s in cfg.inputs if cfg.shape_for(s, "min") != cfg.shape_for(s, "max")]
        if dynamic:
            problems.append(f"DLA needs static shapes; inputs {', '.join(dynamic)} have dynamic dims (min != max)")
            hints.append("set min = opt = max for every [dims] entry of a DLA build")
    if cfg.export.opset is not None and target.max_opset and cfg.export.opset > target.max_opset:
        problems.append(
            f"export.opset = {cfg.export.opset} is above what target '{target.name}' parses "
            f"(max opset {target.max_opset})"
        )
        hints.append(f"drop export.opset or set it to {target.max_opset} or lower")
    if problems:
        raise TargetCapabilityError("; ".join(problems), hint="; ".join(hints) or None)
