"""``deploy doctor``: the real probe of this machine, the per-target verdicts, and ``--require`` as a gate."""

from __future__ import annotations

import json
import platform
import re
import shutil
from pathlib import Path

import pytest

from edgedeploy.cli import main
from edgedeploy.commands.doctor import (
    Gpu,
    HostEnvironment,
    normalize_arch,
    parse_nvidia_smi,
    probe_host,
    target_readiness,
)
from edgedeploy.errors import TargetCapabilityError
from edgedeploy.targets.profiles import BUILTIN_TARGETS

HERE = probe_host()
TRT_HERE = bool(HERE.tensorrt_version)

ORIN = HostEnvironment(
    arch="aarch64",
    python="3.10.12",
    onnxruntime_version="1.20.0",
    ort_providers=("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
    tensorrt_version="10.3.0",
    trtexec="/usr/src/tensorrt/bin/trtexec",
    gpus=(Gpu("Orin (nvgpu)", "8.7"),),
    jetson_model="NVIDIA Jetson AGX Orin Developer Kit",
)
RTX_TRT_10_13 = HostEnvironment(
    arch="x86_64",
    python="3.12.3",
    onnxruntime_version="1.22.0",
    ort_providers=("CPUExecutionProvider",),
    tensorrt_version="10.13.2.6",
    gpus=(Gpu("NVIDIA GeForce RTX 4090", "8.9"),),
)


def verdicts(env: HostEnvironment) -> dict[str, bool]:
    return {name: target_readiness(env, t).artifact_here for name, t in BUILTIN_TARGETS.items()}


def test_parse_nvidia_smi_csv():
    text = "NVIDIA GeForce RTX 4090, 8.9\nNVIDIA H100 80GB HBM3, 9.0\n\n"
    assert parse_nvidia_smi(text) == [Gpu("NVIDIA GeForce RTX 4090", "8.9"), Gpu("NVIDIA H100 80GB HBM3", "9.0")]
    # Drivers too old for compute_cap print "[N/A]" (or nothing): the GPU is still reported, its SM unknown.
    assert parse_nvidia_smi("Tesla T4, [N/A]\n") == [Gpu("Tesla T4", "")]
    assert parse_nvidia_smi("Tesla T4\n") == [Gpu("Tesla T4", "")]


@pytest.mark.parametrize(("machine", "arch"), [("x86_64", "x86_64"), ("AMD64", "x86_64"), ("arm64", "aarch64")])
def test_normalize_arch(machine, arch):
    assert normalize_arch(machine) == arch


def test_jetson_orin_host_builds_orin_engines_only():
    expected = {
        "cpu": True,
        "desktop": False,
        "desktop-trt11": False,
        "jetson-orin": True,
        "jetson-orin-nano": True,
        "jetson-xavier": False,
        "jetson-nano": False,
    }
    assert {name: verdicts(ORIN)[name] for name in expected} == expected
    profile = BUILTIN_TARGETS["jetson-xavier"]
    xavier = target_readiness(ORIN, profile)
    # Every unmet requirement is reported at once, not just the first.
    assert xavier.reasons == (
        f"TensorRT 10.3.0 here, target needs {profile.trt_version}",
        f"target needs SM {profile.sm}, found Orin (nvgpu) (SM 8.7)",
    )
    assert "device bundle only" in xavier.what


def test_desktop_gpu_host_matches_tensorrt_major_minor():
    assert verdicts(RTX_TRT_10_13)["desktop"] is True
    assert verdicts(RTX_TRT_10_13)["desktop-trt11"] is False
    trt11 = target_readiness(RTX_TRT_10_13, BUILTIN_TARGETS["desktop-trt11"])
    assert trt11.reasons == (f"TensorRT 10.13.2.6 here, target needs {BUILTIN_TARGETS['desktop-trt11'].trt_version}",)
    # desktop fixes no SM (any GPU), but a GPU must be there
    no_gpu = HostEnvironment(**{**RTX_TRT_10_13.to_dict(), "gpus": ()})
    assert target_readiness(no_gpu, BUILTIN_TARGETS["desktop"]).reasons == ("no NVIDIA GPU found",)


def test_cpu_target_needs_onnxruntime_cpu_provider():
    bare = HostEnvironment(arch="x86_64", python="3.11.0")
    r = target_readiness(bare, BUILTIN_TARGETS["cpu"])
    assert not r.artifact_here and r.reasons == ("onnxruntime not installed",)
    gpu_only = HostEnvironment(arch="x86_64", python="3.11", onnxruntime_version="1.20", ort_providers=("X",))
    assert target_readiness(gpu_only, BUILTIN_TARGETS["cpu"]).reasons == ("onnxruntime has no CPUExecutionProvider",)


def test_probe_reports_this_machine():
    import onnxruntime
    import torch

    assert HERE.arch == normalize_arch(platform.machine())
    assert HERE.python == platform.python_version()
    assert HERE.torch_version == str(torch.__version__)
    assert HERE.torch_cuda == torch.cuda.is_available()
    assert HERE.onnxruntime_version == onnxruntime.__version__
    assert set(HERE.ort_providers) == set(onnxruntime.get_available_providers())
    assert target_readiness(HERE, BUILTIN_TARGETS["cpu"]).artifact_here


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi (no NVIDIA GPU) here")
def test_probe_finds_the_nvidia_gpus():
    assert HERE.gpus, "nvidia-smi is on PATH but no GPU was probed"
    assert all(g.name and re.fullmatch(r"\d+\.\d+", g.sm) for g in HERE.gpus), HERE.gpus


def test_cli_json_report(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["host"]["arch"] == HERE.arch
    assert report["host"]["onnxruntime_version"] == HERE.onnxruntime_version
    assert set(report["targets"]) == set(BUILTIN_TARGETS)
    assert report["targets"]["cpu"]["artifact_here"] is True
    for name, entry in report["targets"].items():
        assert entry["artifact_here"] == (not entry["reasons"]), name


def test_cli_text_report_and_require_cpu(capsys):
    assert main(["doctor", "--require", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime" in out and "CPUExecutionProvider" in out
    assert all(name in out for name in BUILTIN_TARGETS)


@pytest.mark.skipif(TRT_HERE, reason="TensorRT is installed here: the desktop engine may be buildable")
def test_require_unbuildable_target_exits_4_naming_reasons(capsys):
    code = main(["doctor", "--require", "desktop", "--require", "jetson-orin"])
    assert code == TargetCapabilityError.exit_code == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "desktop" in err[0] and "jetson-orin" in err[0] and "TensorRT (Python module) not installed" in err[0]


def test_require_unknown_target_is_a_config_error(capsys):
    assert main(["doctor", "--require", "jetson-orn"]) == 2
    assert "did you mean 'jetson-orin'" in capsys.readouterr().err


def test_user_targets_file_is_reported(tmp_path: Path, capsys):
    targets = tmp_path / "targets.toml"
    targets.write_text('[targets.edge-box]\nbase = "cpu"\ndescription = "our ARM box"\n')
    assert main(["doctor", "--json", "--targets-file", str(targets), "--require", "edge-box"]) == 0
    assert json.loads(capsys.readouterr().out)["targets"]["edge-box"]["artifact_here"] is True
