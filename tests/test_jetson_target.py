"""``--target jetson`` / ``desktop`` resolution (faked /proc/device-tree/model and nv_tegra_release),
capability checks before any stage, FP32 trtexec lines without TF32, and no silent INT8 -> FP32."""

from __future__ import annotations

import dataclasses

import pytest
from test_trt_plan import _cfg

from edgedeploy.errors import ConfigError, TargetCapabilityError
from edgedeploy.targets import get_target
from edgedeploy.targets.resolve import check_capabilities, read_jetson, resolve_target
from edgedeploy.trt.plan import BuildPlan, InputProfile
from edgedeploy.trt.trtexec import trtexec_args

# what the files say on each module (model has a trailing NUL in the device tree)
NANO = (
    "NVIDIA Jetson Nano Developer Kit\0",
    "# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref, EABI: aarch64",
)
XAVIER = ("Jetson-AGX\0", "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64")
XAVIER_NX = (
    "NVIDIA Jetson Xavier NX Developer Kit\0",
    "# R35 (release), REVISION: 2.1, GCID: 32413640, BOARD: t186ref",
)
ORIN = ("NVIDIA Jetson AGX Orin Developer Kit\0", "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic")
ORIN_NANO = ("NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super\0", "# R36 (release), REVISION: 4.3")


def fake_jetson(tmp_path, files):
    model, release = tmp_path / "model", tmp_path / "nv_tegra_release"
    model.write_bytes(files[0].encode())
    release.write_text(files[1] + "\n")
    return {"model_path": model, "release_path": release}


@pytest.mark.parametrize(
    ("files", "profile"),
    [(NANO, "jetson-nano"), (XAVIER, "jetson-xavier"), (XAVIER_NX, "jetson-xavier"), (ORIN, "jetson-orin")]
    + [(ORIN_NANO, "jetson-orin-nano")],
)
def test_on_a_jetson_the_module_and_l4t_pick_the_profile(tmp_path, files, profile):
    target, how = resolve_target("jetson", **fake_jetson(tmp_path, files))
    assert target.name == profile
    assert how.startswith(" (from 'jetson': detected ") and "L4T" in how


def test_a_jetson_without_a_builtin_profile_is_refused_with_what_was_found(tmp_path):
    old_nano = (NANO[0], "# R32 (release), REVISION: 6.1, GCID: 27863751, BOARD: t210ref")  # JetPack 4.6: TRT 8.0
    with pytest.raises(TargetCapabilityError, match=r"Jetson Nano Developer Kit, L4T 32\.6\.1\) has no built-in"):
        resolve_target("jetson", **fake_jetson(tmp_path, old_nano))


def test_on_a_host_jetson_resolves_to_the_configured_default_and_says_so(tmp_path):
    absent = {"model_path": tmp_path / "none", "release_path": tmp_path / "none2"}
    target, how = resolve_target("jetson", **absent)
    assert (target.name, how) == ("jetson-orin", " (from 'jetson': not on a Jetson: [build] jetson default)")
    target, _ = resolve_target("jetson", jetson_default="jetson-xavier", **absent)
    assert target.name == "jetson-xavier"
    with pytest.raises(ConfigError, match="unknown target 'jetson-tx2'"):
        resolve_target("jetson", jetson_default="jetson-tx2", **absent)
    assert read_jetson(**absent) is None


def test_desktop_uses_the_local_tensorrt_and_gpu_when_present():
    target, how = resolve_target("desktop", local_tensorrt=("10.8.0.43", {"name": "RTX 4090", "sm": "8.9"}))
    assert (target.name, target.trt_version, target.sm) == ("desktop", "10.8", "8.9")
    assert "local TensorRT 10.8.0.43 on RTX 4090" in how
    target, _ = resolve_target("desktop", local_tensorrt=("11.5.0.4", {"name": "B200", "sm": "10.0"}))
    assert target.name == "desktop-trt11" and target.strongly_typed_only
    target, how = resolve_target("desktop", local_tensorrt=(None, None))
    assert target == get_target("desktop") and "no local TensorRT" in how


def test_deploy_build_target_jetson_says_which_profile_in_the_first_line(tmp_path, monkeypatch):
    from conftest import write_tiny_project

    from edgedeploy.api import build
    from edgedeploy.targets import resolve

    monkeypatch.setattr(resolve, "DEVICE_TREE_MODEL", tmp_path / "no-device-tree")  # a host, wherever CI runs
    cfg = write_tiny_project(tmp_path / "p")
    lines: list[str] = []
    result = build(cfg, log=lines.append, build__target="jetson")
    assert lines[0].startswith("deploy build: target=jetson-orin (from 'jetson': not on a Jetson")
    assert result.report["target"] == "jetson-orin"


def test_capability_problems_are_all_named_before_any_stage():
    cfg = _cfg("fp32", dla_core=0)  # dynamic batch dim, FP32 on DLA
    with pytest.raises(TargetCapabilityError) as exc:
        check_capabilities(get_target("jetson-orin"), cfg)
    assert "runs FP16 and INT8 layers only" in exc.value.message
    assert "DLA needs static shapes; inputs x have dynamic dims" in exc.value.message
    check_capabilities(get_target("jetson-orin"), _cfg("fp16", dynamic=False, dla_core=0))
    with pytest.raises(TargetCapabilityError, match="cannot run int8"):
        check_capabilities(get_target("jetson-nano"), _cfg("int8"))


def _plan(**kw) -> BuildPlan:
    base = dict(
        target="jetson-orin", trt_version="10.3", sm="8.7", precision="fp32", strategy="fp32", onnx="model.onnx",
        strongly_typed=False, inputs=(InputProfile("x", (1, 4), (2, 4), (4, 4)),), workspace_mib=256,
    )  # fmt: skip
    return dataclasses.replace(BuildPlan(**base), **kw)


@pytest.mark.parametrize("version", ["8.2", "8.5", "10.3", "11.5"])
def test_fp32_trtexec_lines_turn_tf32_off(version):
    assert "--noTF32" in trtexec_args(_plan(trt_version=version))[0]
    fp16 = _plan(trt_version=version, precision="fp16", strategy="fp16-flag")
    assert "--noTF32" not in trtexec_args(fp16)[0]


def test_int8_trtexec_lines_enable_fp16_too():
    argv = trtexec_args(_plan(trt_version="8.5", precision="int8", strategy="int8-calib-cache", calib_cache="c"))[0]
    assert {"--int8", "--fp16", "--calib=c"} <= set(argv) and "--noTF32" not in argv


def test_torch_tensorrt_never_compiles_an_int8_plan_as_fp32():
    from edgedeploy.trt.torch_builders import torch_tensorrt_settings

    with pytest.raises(TargetCapabilityError, match="would give an FP32 engine"):
        torch_tensorrt_settings(_plan(precision="int8", strategy="int8-qdq", onnx="model.int8.onnx"))
    assert torch_tensorrt_settings(_plan(precision="fp16", strategy="fp16-flag"))["enabled_precisions"] == [
        "float32",
        "float16",
    ]
