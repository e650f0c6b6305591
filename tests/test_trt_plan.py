"""Build plans (precision routes, profiles, limits) and the trtexec command lines made from them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.config import config_from_dict
from edgedeploy.errors import StageError, TargetCapabilityError
from edgedeploy.targets import get_target
from edgedeploy.trt.plan import BuildPlan, make_plan, qdq_problems, read_plan, write_plan
from edgedeploy.trt.trtexec import trtexec_args, trtexec_script


def _cfg(precision: str = "fp32", *, dynamic: bool = True, **build: object):
    raw = {
        "outputs": ["y"],
        "model": {"factory": "m:build"},
        "inputs": [{"name": "x", "shape": ["batch", 3, 8, 8] if dynamic else [2, 3, 8, 8]}],
        "dims": {"batch": {"min": 1, "opt": 4, "max": 8}} if dynamic else {},
        "precision": {"mode": precision},
        "build": dict(build),
    }
    return config_from_dict(raw)


def _qdq_model(path: Path, *, zero_point: np.ndarray) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.array(0.05, dtype=np.float32), "scale"),
        numpy_helper.from_array(zero_point, "zp"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["xq"], name="q"),
        helper.make_node("DequantizeLinear", ["xq", "scale", "zp"], ["xd"], name="dq"),
        helper.make_node("Relu", ["xd"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def files(tmp_path):
    """The precision stage's possible outputs, as real files."""
    (tmp_path / "calib.cache").write_text("TRT-100300-EntropyCalibration2\nx: 3c000000\n")
    fp32 = tmp_path / "model.onnx"
    _qdq_model(fp32, zero_point=np.array(0, dtype=np.int8))  # any valid ONNX file stands in for the FP32 graph
    return {
        "model.onnx": fp32,
        "qdq": _qdq_model(tmp_path / "model.int8.onnx", zero_point=np.array(0, dtype=np.int8)),
        "calib": tmp_path / "calib.cache",
    }


def test_fp32_plan_has_profiles_from_named_dims_and_target_defaults(files):
    plan = make_plan(_cfg(), get_target("jetson-orin"), {"model.onnx": files["model.onnx"]})
    assert (plan.strategy, plan.onnx, plan.strongly_typed) == ("fp32", "model.onnx", False)
    assert plan.profiles() == [{"x": ((1, 3, 8, 8), (4, 3, 8, 8), (8, 3, 8, 8))}]
    assert (plan.workspace_mib, plan.trt_version, plan.sm, plan.timing_cache) == (1024, "10.3", "8.7", "timing.cache")
    static = make_plan(_cfg(dynamic=False), get_target("jetson-orin"), {})
    assert static.profiles() == [] and not static.dynamic


def test_plan_round_trips_through_plan_json(tmp_path, files):
    plan = make_plan(_cfg(dla_core=1, precision="fp16"), get_target("jetson-xavier"), {})
    path = write_plan(plan, tmp_path)
    assert read_plan(path) == plan
    assert json.loads(path.read_text())["schema"] == "edgedeploy-plan/1"
    with pytest.raises(StageError, match="not an edgedeploy build plan"):
        BuildPlan.from_dict({"schema": "other"})


def test_fp16_routes_follow_the_precision_stage_and_the_tensorrt_version(files):
    fp16 = {"model.fp16.onnx": files["model.onnx"]}
    pins = {"onnx_dtype": "float32", "fp32_layers": [{"node": "b", "why": "overflow"}, {"node": "a", "why": "x"}]}
    flag = make_plan(_cfg("fp16"), get_target("jetson-xavier"), fp16, precision_info=pins)
    assert (flag.strategy, flag.onnx, flag.strongly_typed, flag.fp32_layers) == (
        "fp16-flag",
        "model.onnx",  # the FP32 graph: a stale model.fp16.onnx next to it is never built from
        False,
        ("a", "b"),
    )
    assert flag.fp32_output_layers == ()  # no entry says its output is float: precision pins only
    typed = make_plan(_cfg("fp16"), get_target("desktop-trt11"), fp16, precision_info={"onnx_dtype": "float16"})
    assert (typed.strategy, typed.strongly_typed, typed.fp32_layers) == ("fp16-typed", True, ())
    with pytest.raises(StageError, match="no FP16 builder flag"):
        make_plan(_cfg("fp16"), get_target("desktop-trt11"), {}, precision_info=None)


def test_int8_prefers_symmetric_qdq_and_falls_back_to_the_calibration_cache_on_tensorrt_8(files):
    xavier = get_target("jetson-xavier")  # TensorRT 8.5: implicit INT8 still exists
    qdq = make_plan(_cfg("int8"), xavier, {"model.int8.onnx": files["qdq"]})
    assert (qdq.strategy, qdq.onnx, qdq.calib_cache) == ("int8-qdq", "model.int8.onnx", None)
    info = {"kept_float": [{"node": "head", "why": "sensitive"}]}
    implicit = make_plan(_cfg("int8"), xavier, {"calib.cache": files["calib"]}, precision_info=info)
    assert (implicit.strategy, implicit.onnx, implicit.calib_cache, implicit.fp32_layers) == (
        "int8-calib-cache",
        "model.onnx",
        "calib.cache",
        ("head",),
    )
    with pytest.raises(StageError, match="needs a symmetric Q/DQ model.int8.onnx; the precision stage"):
        make_plan(_cfg("int8"), get_target("desktop-trt11"), {"calib.cache": files["calib"]})


@pytest.mark.parametrize("name", ["jetson-orin", "jetson-orin-nano", "desktop", "desktop-trt11"])
def test_tensorrt_10_1_and_later_take_explicit_qdq_only(files, name):
    target = get_target(name)
    assert target.explicit_int8_only and not target.implicit_int8
    both = {"model.int8.onnx": files["qdq"], "calib.cache": files["calib"]}
    plan = make_plan(_cfg("int8"), target, both)
    assert (plan.strategy, plan.onnx, plan.calib_cache) == ("int8-qdq", "model.int8.onnx", None)
    with pytest.raises(
        StageError, match=r"wrote none \(calib.cache is not used: TensorRT [0-9.]+ has no implicit INT8"
    ):
        make_plan(_cfg("int8"), target, {"calib.cache": files["calib"]})


def test_a_qdq_model_an_explicit_only_target_cannot_take_fails_with_the_reason(files, tmp_path):
    bad = _qdq_model(tmp_path / "model.int8.onnx", zero_point=np.array(128, dtype=np.uint8))
    with pytest.raises(StageError, match=r"cannot take \(2\).*TensorRT 10.3 takes explicit Q/DQ INT8 only"):
        make_plan(_cfg("int8"), get_target("jetson-orin"), {"model.int8.onnx": bad, "calib.cache": files["calib"]})


def test_asymmetric_qdq_is_refused_with_every_offending_node(tmp_path):
    bad = _qdq_model(tmp_path / "model.int8.onnx", zero_point=np.array(128, dtype=np.uint8))
    is_qdq, problems = qdq_problems(bad)
    assert is_qdq and len(problems) == 2 and all("uint8" in p for p in problems)
    with pytest.raises(StageError, match=r"Q/DQ nodes TensorRT cannot take \(2\)"):
        make_plan(_cfg("int8"), get_target("jetson-orin"), {"model.int8.onnx": bad})


def test_int32_quantized_bias_is_named_and_the_calibration_cache_route_is_taken_instead(tmp_path, files):
    bad = _qdq_model(tmp_path / "model.int8.onnx", zero_point=np.array(0, dtype=np.int32))
    problems = qdq_problems(bad)[1]
    assert len(problems) == 2 and all("int32-quantized bias" in p and "QuantizeBias" in p for p in problems)
    plan = make_plan(_cfg("int8"), get_target("jetson-xavier"), {"model.int8.onnx": bad, "calib.cache": files["calib"]})
    assert plan.strategy == "int8-calib-cache"
    assert any(n.startswith("the Q/DQ model was not used") for n in plan.notes)
    for name in ("jetson-orin", "desktop-trt11"):  # TensorRT >= 10.1: no calibration-cache route
        with pytest.raises(StageError, match="int32-quantized bias"):
            make_plan(_cfg("int8"), get_target(name), {"model.int8.onnx": bad, "calib.cache": files["calib"]})


def test_capability_and_memory_limits_raise_instead_of_downgrading():
    with pytest.raises(TargetCapabilityError, match="cannot run int8"):
        make_plan(_cfg("int8"), get_target("jetson-nano"), {})
    with pytest.raises(TargetCapabilityError, match="FP16 and INT8 layers only"):
        make_plan(_cfg("fp32", dla_core=0), get_target("jetson-orin"), {})
    with pytest.raises(TargetCapabilityError, match="exceeds target 'jetson-orin-nano' memory"):
        make_plan(_cfg(workspace_mib=9000), get_target("jetson-orin-nano"), {})


def test_trtexec_flags_follow_each_tensorrt_version(files):
    nano = make_plan(_cfg("fp16"), get_target("jetson-nano"), {}, precision_info={"fp32_layers": ["a"]})
    argv, notes = trtexec_args(nano)
    assert "--workspace=256" in argv and "--fp16" in argv
    assert not any(a.startswith(("--memPoolSize", "--builderOptimizationLevel", "--layerPrecisions")) for a in argv)
    assert notes and "cannot pin layers" in notes[0]
    assert "--minShapes=x:1x3x8x8" in argv and "--maxShapes=x:8x3x8x8" in argv and "--optShapes=x:4x3x8x8" in argv

    xavier = make_plan(_cfg("int8", dla_core=1), get_target("jetson-xavier"), {"calib.cache": files["calib"]})
    argv, _ = trtexec_args(xavier)
    assert {"--memPoolSize=workspace:512", "--int8", "--calib=calib.cache", "--useDLACore=1"} <= set(argv)
    assert "--allowGPUFallback" in argv and not any(a.startswith("--builderOptimizationLevel") for a in argv)

    pinned = make_plan(_cfg("fp16"), get_target("jetson-orin"), {}, precision_info={"fp32_layers": ["a", "b"]})
    argv, notes = trtexec_args(pinned)
    assert {"--layerPrecisions=a:fp32,b:fp32", "--precisionConstraints=obey", "--builderOptimizationLevel=3"} <= set(
        argv
    )
    assert notes == [] and not any(a.startswith("--layerOutputTypes") for a in argv)
    # output types only for the pins whose one output is float (an ArgMax's int64 output cannot be fp32)
    info = {
        "fp32_layers": [
            {"node": "conv", "why": "overflow", "pin_output_type": True},
            {"node": "argmax", "why": "x", "pin_output_type": False},
        ]
    }
    mixed = make_plan(_cfg("fp16"), get_target("jetson-orin"), {}, precision_info=info)
    argv, _ = trtexec_args(mixed)
    assert {"--layerPrecisions=argmax:fp32,conv:fp32", "--layerOutputTypes=conv:fp32"} <= set(argv)
    assert BuildPlan.from_dict(json.loads(json.dumps(mixed.to_dict()))) == mixed

    t11 = make_plan(_cfg("int8"), get_target("desktop-trt11"), {"model.int8.onnx": files["qdq"]})
    argv, _ = trtexec_args(t11)
    assert argv[1] == "--onnx=model.int8.onnx"
    assert not {"--int8", "--fp16", "--stronglyTyped"} & set(argv)  # 11.x: gone, strong typing always on
    typed10 = make_plan(_cfg("fp16"), get_target("desktop"), {"model.fp16.onnx": files["model.onnx"]})
    assert "--stronglyTyped" in trtexec_args(typed10)[0] and "--fp16" not in trtexec_args(typed10)[0]


def test_trtexec_script_is_valid_shell_and_runs_the_plan(tmp_path, files):
    plan = make_plan(_cfg("fp16"), get_target("jetson-orin"), {})
    script = tmp_path / "trtexec.sh"
    script.write_text(trtexec_script(plan))
    subprocess.run(["sh", "-n", str(script)], check=True)
    fake = tmp_path / "fake_trtexec"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > args.txt\n')
    fake.chmod(0o755)
    subprocess.run(["sh", str(script)], check=True, env={"TRTEXEC": str(fake), "PATH": "/usr/bin:/bin"})
    args = (tmp_path / "args.txt").read_text().split("\n")
    assert args[:2] == ["--onnx=model.onnx", "--saveEngine=model.engine"]
    assert "--fp16" in args and "--timingCacheFile=timing.cache" in args


def test_torch_builders_follow_the_same_plan_and_refuse_what_they_cannot_do(files):
    import importlib.util

    from edgedeploy.trt.torch_builders import build_with_torch2trt, build_with_torch_tensorrt, torch_tensorrt_settings

    plan = make_plan(_cfg("fp16", workspace_mib=256), get_target("desktop"), {})
    settings = torch_tensorrt_settings(plan)
    assert settings["inputs"] == [
        {"min_shape": (1, 3, 8, 8), "opt_shape": (4, 3, 8, 8), "max_shape": (8, 3, 8, 8), "name": "x"}
    ]
    assert (settings["enabled_precisions"], settings["workspace_size"]) == (["float32", "float16"], 256 << 20)
    implicit = make_plan(_cfg("int8"), get_target("jetson-xavier"), {"calib.cache": files["calib"]})
    with pytest.raises(TargetCapabilityError, match="calibration cache"):
        torch_tensorrt_settings(implicit)
    with pytest.raises(StageError, match="torch2trt would calibrate INT8"):
        build_with_torch2trt(object(), implicit, [])
    if importlib.util.find_spec("torch_tensorrt") is None:
        with pytest.raises(StageError, match="torch_tensorrt is not installed"):
            build_with_torch_tensorrt(object(), plan)
    if importlib.util.find_spec("torch2trt") is None:
        with pytest.raises(StageError, match="torch2trt is not installed"):
            build_with_torch2trt(object(), plan, [])


def test_torch2trt_gets_dla_and_shapes_and_refuses_int8_for_the_right_reason(files, monkeypatch):
    """torch2trt (master, TensorRT 10 support) runs DLA with static shapes; only INT8 is refused."""
    import sys
    import types

    from trt_fakes import make_tensorrt

    from edgedeploy.trt.torch_builders import build_with_torch2trt, torch2trt_settings

    calls: list[dict] = []
    fake = types.ModuleType("torch2trt")
    fake.torch2trt = lambda model, example, **kw: calls.append(kw) or "module"
    monkeypatch.setitem(sys.modules, "torch2trt", fake)
    trt = make_tensorrt("10.3")
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    dla = make_plan(_cfg("fp16", dynamic=False, dla_core=0), get_target("jetson-orin"), {})
    assert build_with_torch2trt(object(), dla, []) == "module"
    kw = calls[-1]
    assert kw["default_device_type"] is trt.DeviceType.DLA and kw["dla_core"] == 0 and kw["gpu_fallback"]
    assert kw["fp16_mode"] and kw["min_shapes"] == kw["max_shapes"] == [(2, 3, 8, 8)]
    assert "default_device_type" not in torch2trt_settings(make_plan(_cfg("fp16"), get_target("desktop"), {}))
    implicit = make_plan(_cfg("int8"), get_target("jetson-xavier"), {"calib.cache": files["calib"]})
    with pytest.raises(StageError, match="example input alone") as exc:
        build_with_torch2trt(object(), implicit, [])
    assert "DLA" not in str(exc.value)


def test_a_symbolic_onnx_dim_gets_a_profile_even_when_the_config_fixes_its_size(files):
    # the config's batch is 2 everywhere, but the ONNX model's input dim is named: TensorRT's parser makes it -1,
    # and a network with a -1 input and no profile fails the build ("no optimization profile has been defined")
    raw = {
        "outputs": ["y"], "model": {"factory": "m:build"},
        "inputs": [{"name": "x", "shape": ["batch", 3, 8, 8]}],
        "dims": {"batch": {"min": 2, "opt": 2, "max": 2}},
    }  # fmt: skip
    cfg = config_from_dict(raw)
    plan = make_plan(cfg, get_target("jetson-xavier"), {"model.onnx": files["model.onnx"]})
    assert plan.dynamic and plan.profiles() == [{"x": ((2, 3, 8, 8), (2, 3, 8, 8), (2, 3, 8, 8))}]
    argv, _ = trtexec_args(plan)
    assert "--minShapes=x:2x3x8x8" in argv and "--maxShapes=x:2x3x8x8" in argv
    assert read_plan(write_plan(plan, files["model.onnx"].parent)).profiles() == plan.profiles()


def test_a_model_whose_onnx_dims_are_fixed_needs_no_profile(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8, 8])],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(tmp_path / "model.onnx"))
    raw = {
        "outputs": ["y"], "model": {"factory": "m:build"},
        "inputs": [{"name": "x", "shape": ["batch", 3, 8, 8]}],
        "dims": {"batch": {"min": 2, "opt": 2, "max": 2}},
    }  # fmt: skip
    plan = make_plan(config_from_dict(raw), get_target("jetson-xavier"), {"model.onnx": tmp_path / "model.onnx"})
    assert not plan.dynamic and plan.profiles() == []
    assert not any(a.startswith("--minShapes") for a in trtexec_args(plan)[0])
