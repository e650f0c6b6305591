"""The device side (adapter + complete_bundle.py + trt_runner.py) against a fake ``tensorrt`` per version.

The fakes (tests/trt_fakes.py) raise AttributeError on any member a TensorRT release lacks, so a
call that does not exist in 8.2, 8.5, 10.3, 10.13 or 11 fails here. They prove the call shape, not
numerics: the "engine" is the ONNX model run by ONNX Runtime.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from trt_fakes import VERSIONS, FakeLibCuda, make_tensorrt, members_for, stub_members

from edgedeploy.device import complete_bundle as device
from edgedeploy.device import trt_runner
from edgedeploy.trt import adapter
from edgedeploy.trt.plan import BuildPlan, InputProfile

TARGET_OF = {"8.2": ("jetson-nano", "5.3"), "8.5": ("jetson-xavier", "7.2"), "10.3": ("jetson-orin", "8.7")}
TARGET_OF.update({"10.13": ("desktop", "8.9"), "11": ("desktop-trt11", "8.9")})
W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10.0 - 0.5


def tiny_onnx(path: Path) -> None:
    """x[batch,4] -> Constant W -> MatMul -> Relu = logits[batch,3]; ArgMax = label (int64)."""
    nodes = [
        helper.make_node("Constant", [], ["w"], name="const_w", value=numpy_helper.from_array(W, "w")),
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="matmul"),
        helper.make_node("Relu", ["mm"], ["logits"], name="relu"),
        helper.make_node("ArgMax", ["logits"], ["label"], name="argmax", axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def make_bundle(folder: Path, version: str, precision: str = "fp32", **plan_fields) -> Path:
    """A hand-made bundle (model, goldens, plan, manifest) for the target that ships ``version``."""
    folder.mkdir(parents=True, exist_ok=True)
    target, sm = TARGET_OF[version]
    tiny_onnx(folder / "model.onnx")
    strategy = {"fp32": "fp32", "fp16": "fp16-flag", "int8": "int8-calib-cache"}[precision]
    plan = BuildPlan(
        target=target,
        trt_version=version if version != "11" else "11.5",
        sm=sm,
        precision=precision,
        strategy=strategy,
        onnx="model.onnx",
        strongly_typed=version == "11",
        inputs=(InputProfile("x", (1, 4), (2, 4), (4, 4)),),
        workspace_mib=64,
        **plan_fields,
    )
    (folder / "plan.json").write_text(json.dumps(plan.to_dict()))
    rng = np.random.default_rng(0)
    arrays = {}
    for point, batch in (("min", 1), ("opt", 2), ("max", 4)):
        x = rng.standard_normal((batch, 4)).astype(np.float32)
        logits = np.maximum(x @ W, 0)
        arrays.update({f"{point}/0/in/x": x, f"{point}/0/out/logits": logits})
        arrays[f"{point}/0/out/label"] = logits.argmax(1)
    np.savez(folder / "goldens.npz", **arrays)
    files = [p.name for p in folder.iterdir() if p.is_file()]
    manifest = {
        "schema": device.BUNDLE_SCHEMA,
        "plan": "plan.json",
        "goldens": "goldens.npz",
        "files": {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in files},
        "validation": {"tolerance": {"atol": 1e-5, "rtol": 1e-5}, "classifier_outputs": ["logits"]},
    }
    (folder / "bundle.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture
def fake_device(monkeypatch, tmp_path):
    """Install a fake TensorRT of a version plus a fake libcuda.so.1; polygraphy fails to import with SyntaxError."""
    bad = tmp_path / "py36site" / "polygraphy"
    bad.mkdir(parents=True)
    # what pip's polygraphy 0.53 does on Python 3.6: `from __future__ import annotations` is a SyntaxError there
    (bad / "__init__.py").write_text("raise SyntaxError('future feature annotations is not defined')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "py36site"))
    for name in [m for m in sys.modules if m == "polygraphy" or m.startswith("polygraphy.")]:
        monkeypatch.delitem(sys.modules, name)

    def install(version: str, sm: str) -> tuple:
        lib = FakeLibCuda(name=f"Fake SM {sm}", sm=sm)
        trt = make_tensorrt(version, lib)
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        monkeypatch.setattr(adapter, "_load_driver", lambda: lib)
        monkeypatch.setattr(trt_runner, "load_driver", lambda names=(): lib)
        # in the package, complete_bundle.py sits beside trt_runner.py and loads that file as `trt_runner`
        monkeypatch.setattr(device.sibling("trt_runner"), "load_driver", lambda names=(): lib)
        return trt, lib

    return install


def run_device_step(bundle: Path, lines: list[str], *extra: str) -> dict:
    args = device.parser().parse_args([str(bundle), "--latency-iters", "2", *extra])
    return device.run(args, lines.append)


def test_the_fakes_implement_only_what_some_release_declares():
    trt = make_tensorrt("10.13")
    stubs, old = stub_members(), members_for("8.5")
    for api, implemented in trt._implemented.items():
        known = stubs[api] | old.get(api, set())
        assert implemented <= known, f"the fake invents {api}.{sorted(implemented - known)}"


def test_fakes_refuse_calls_their_version_lacks():
    old, new, v11 = make_tensorrt("8.2"), make_tensorrt("10.13"), make_tensorrt("11")
    assert not hasattr(old, "MemoryPoolType") and hasattr(new, "MemoryPoolType")
    assert not hasattr(v11.BuilderFlag, "FP16") and hasattr(new.BuilderFlag, "FP16")
    assert not hasattr(v11, "IInt8EntropyCalibrator2")
    config = old.Builder(old.Logger()).create_builder_config()
    with pytest.raises(AttributeError, match="TensorRT 8.2.1.8 has no IBuilderConfig.set_memory_pool_limit"):
        config.set_memory_pool_limit(None, 1)


@pytest.mark.parametrize("version", list(VERSIONS))
def test_device_step_builds_and_validates_against_each_tensorrt_version(version, fake_device, tmp_path):
    target, sm = TARGET_OF[version]
    trt, lib = fake_device(version, sm)
    bundle = make_bundle(tmp_path / "b", version)
    lines: list[str] = []
    result = run_device_step(bundle, lines)
    assert result["status"] == "passed", lines
    want_api = "bindings (execute_v2)" if version == "8.2" else "named tensors (execute_async_v3)"
    assert result["runner"] == f"tensorrt ({want_api})"
    assert result["engine"]["tensorrt"] == VERSIONS[version] and result["engine"]["gpu"]["sm"] == sm
    assert {"cuMemAlloc_v2", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemFree_v2"} <= set(lib.calls)
    used = set(trt._state.calls)
    if version == "8.2":
        assert {"IExecutionContext.execute_v2", "IExecutionContext.set_binding_shape"} <= used
        assert "IBuilderConfig.max_workspace_size=" in used
    else:
        assert {"IExecutionContext.execute_async_v3", "IExecutionContext.set_tensor_address"} <= used
    if version != "8.2":  # polygraphy's SyntaxError was caught and said so
        assert any("SyntaxError" in line and "trt_runner.py" in line for line in lines)
    header = json.loads((bundle / "model.engine").read_bytes()[8:].split(b"\n", 1)[0])
    assert "TF32" not in header["flags"], "FP32 builds must clear TF32"


@pytest.mark.parametrize("version", ["8.5", "10.3"])
def test_int8_calibration_cache_from_the_host_is_retargeted_to_the_installed_patch_release(
    version, fake_device, tmp_path
):
    trt, _ = fake_device(version, TARGET_OF[version][1])
    bundle = tmp_path / "b"
    bundle.mkdir()
    # the host writes the profile's short version: 8.5 -> TRT-8500, 10.3 -> TRT-100300
    short = "TRT-8500" if version == "8.5" else "TRT-100300"
    (bundle / "calib.cache").write_text(f"{short}-EntropyCalibration2\nx: 3c010a14\nlogits: 3c010a14\n")
    make_bundle(bundle, version, "int8", calib_cache="calib.cache")
    lines: list[str] = []
    assert run_device_step(bundle, lines)["status"] == "passed", lines
    header = json.loads((bundle / "model.engine").read_bytes()[8:].split(b"\n", 1)[0])
    assert {"INT8", "FP16"} <= set(header["flags"]), "INT8 builds enable FP16 too"
    assert adapter.retarget_calib_cache(b"TRT-8500-EntropyCalibration2\na: 1\n", "8.5.2.2") == (
        b"TRT-8502-EntropyCalibration2\na: 1\n"
    )


def test_pins_skip_integer_outputs_and_names_without_a_layer(fake_device, tmp_path):
    fake_device("8.5", "7.2")
    bundle = make_bundle(tmp_path / "b", "8.5", "fp16", fp32_layers=("argmax", "const_w", "relu"))
    lines: list[str] = []
    assert run_device_step(bundle, lines)["status"] == "passed", lines
    assert any("1 FP32 pin(s) name no TensorRT layer" in line and "const_w" in line for line in lines)


def test_only_error_messages_decide_out_of_memory(fake_device, tmp_path):
    trt, _ = fake_device("10.3", "8.7")
    onnx_path = tmp_path / "m.onnx"
    tiny_onnx(onnx_path)
    kw = dict(profiles=[], precision="fp32", strongly_typed=False, workspace_mib=64)
    trt._state.build_failure = [
        (2, "Skipping tactic 0x0000000000000001 due to insufficient memory on requested size of 1073741824"),
        (1, "Error Code 4: Internal Error (Network has dynamic or shape inputs, but no optimization profile)"),
    ]
    with pytest.raises(adapter.EngineBuildError) as exc:
        adapter.build_serialized_engine(str(onnx_path), **kw)
    assert not isinstance(exc.value, adapter.BuildOutOfMemoryError)
    trt._state.build_failure = [(1, "Error Code 1: Cuda Runtime (out of memory)")]
    with pytest.raises(adapter.BuildOutOfMemoryError):
        adapter.build_serialized_engine(str(onnx_path), **kw)


def test_cuda_device_uses_the_driver_library():
    lib = FakeLibCuda(name="Orin", sm="8.7")
    assert adapter.cuda_device(lib=lib) == {"name": "Orin", "sm": "8.7"}
    assert lib.calls[0] == "cuInit"
    assert trt_runner.device_info(lib) == {"name": "Orin", "sm": "8.7"}


def test_polygraphy_failing_with_syntax_error_is_a_clear_unavailable(fake_device):
    fake_device("10.3", "8.7")
    with pytest.raises(adapter.TensorRTUnavailable, match="SyntaxError"):
        adapter.EngineSession(b"not an engine")


def test_device_step_args_parse_unchanged():
    assert isinstance(device.parser().parse_args(["."]), argparse.Namespace)


def test_polygraphy_that_imports_but_cannot_run_here_falls_back_to_the_bundled_runner(
    fake_device, tmp_path, monkeypatch
):
    """The real polygraphy (installed in the test venv) against the fake: it fails to run, the step still passes."""
    fake_device("10.13", "8.9")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "py36site" not in p])
    for name in [m for m in sys.modules if m == "polygraphy" or m.startswith("polygraphy.")]:
        monkeypatch.delitem(sys.modules, name)
    pytest.importorskip("polygraphy.backend.trt")
    bundle = make_bundle(tmp_path / "b", "10.13")
    lines: list[str] = []
    result = run_device_step(bundle, lines)
    assert result["status"] == "passed" and result["runner"] == "tensorrt (named tensors (execute_async_v3))"
    assert any(line.startswith("note: ") and "trt_runner.py instead" in line for line in lines)


NANO_DEVICE = """
import ctypes, runpy, sys
sys.path.insert(0, {tests!r})
from trt_fakes import FakeLibCuda, make_tensorrt
lib = FakeLibCuda(name="NVIDIA Tegra X1", sm="5.3")
sys.modules["tensorrt"] = make_tensorrt("8.2", lib)
real_cdll = ctypes.CDLL
ctypes.CDLL = lambda name, *a, **k: lib if "libcuda" in str(name) else real_cdll(name, *a, **k)
for blocked in ("torch", "edgedeploy", "polygraphy"):  # what a Nano does not have
    sys.modules[blocked] = None
sys.argv = [{script!r}, {bundle!r}, "--latency-iters", "1"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_nano_bundle_validates_an_engine_with_its_own_copies_and_no_polygraphy(tmp_path):
    """The bundle's copied scripts, in a process without torch, edgedeploy or polygraphy, on the fake 8.2."""
    import shutil
    import subprocess

    from edgedeploy.stages.build_trt import DEVICE_CODE

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for name, src in DEVICE_CODE.items():
        shutil.copy(src, bundle / name)
    make_bundle(bundle, "8.2")  # manifest lists the copies too
    code = NANO_DEVICE.format(
        tests=str(Path(__file__).parent), script=str(bundle / "complete_bundle.py"), bundle=str(bundle)
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "runner: TensorRT 8.2.1.8 on NVIDIA Tegra X1" in proc.stderr
    assert "PASSED" in proc.stderr
    record = json.loads((bundle / "validation.json").read_text())
    assert record["runner"] == "tensorrt (bindings (execute_v2))"


# ---- member lists read from each release's binding sources -------------------------------------


def test_member_lists_name_the_release_sources_they_were_read_from():
    from trt_fakes import members_source

    for version, tag in (("8.2", "@8.2.1 "), ("8.5", "@8.5.2 "), ("10.3", "@v10.3.0 "), ("11", "@v11.1 ")):
        assert f"NVIDIA/TensorRT{tag}" in members_source(version) and "pyCore.cpp" in members_source(version)


def test_tensorrt_11_fake_has_what_11_has_and_refuses_what_11_removed(tmp_path):
    v10, v11 = make_tensorrt("10.13"), make_tensorrt("11")
    assert hasattr(v11.BuilderFlag, "DIRECT_IO")  # still in 11 (the migration guide does not remove it)
    for gone in ("REJECT_EMPTY_ALGORITHMS", "WEIGHTLESS", "FP16", "INT8", "OBEY_PRECISION_CONSTRAINTS"):
        assert hasattr(v10.BuilderFlag, gone) and not hasattr(v11.BuilderFlag, gone), gone
    onnx_path = tmp_path / "m.onnx"
    tiny_onnx(onnx_path)
    for trt, refuses in ((v10, False), (v11, True)):
        builder = trt.Builder(trt.Logger())
        network = builder.create_network(0)
        trt.OnnxParser(network, trt.Logger()).parse_from_file(str(onnx_path))
        layer, config = network.get_layer(0), builder.create_builder_config()
        tensor = layer.get_output(0)
        checks = [  # called right below, inside this iteration
            lambda: setattr(layer, "precision", trt.float32),  # noqa: B023
            lambda: layer.set_output_type(0, trt.float32),  # noqa: B023
            lambda: setattr(tensor, "dynamic_range", (0.0, 1.0)),  # noqa: B023
            lambda: setattr(config, "algorithm_selector", None),  # noqa: B023
            lambda: builder.platform_has_tf32,  # noqa: B023
        ]
        for check in checks:
            if refuses:
                with pytest.raises(AttributeError, match="TensorRT 11"):
                    check()
            else:  # allowed by the release (the fake may not implement every member it allows)
                try:
                    check()
                except AttributeError as exc:
                    assert "TensorRT" not in str(exc)
    assert "device_memory_size" in members_for("10.13")["ICudaEngine"]
    assert "device_memory_size" not in members_for("11")["ICudaEngine"]


def test_tensorrt_8_engines_have_no_max_workspace_size():
    for version in ("8.2", "8.5"):
        engine = members_for(version)["ICudaEngine"]
        assert "max_workspace_size" not in engine and "get_binding_dtype" in engine
        assert "max_workspace_size" in members_for(version)["IBuilderConfig"]


def test_member_generator_reads_pybind11_declarations():
    sys.path.insert(0, str(Path(__file__).parent / "data" / "trt_members"))
    try:
        from generate_from_sources import parse_bindings
    finally:
        sys.path.pop(0)
    src = """
    py::class_<IBuilder>(m, "Builder", BuilderDoc::descr)
        .def_property_readonly("platform_has_tf32", &IBuilder::platformHasTf32)
        // .def("commented_out", nullptr)
        .def("build_serialized_network", lambdas::build, "network"_a, "config"_a);
    py::class_<IOptimizationProfile, std::unique_ptr<IOptimizationProfile, py::nodelete>>(
        m, "IOptimizationProfile", IOptimizationProfileDoc::descr)
        .def("set_shape", &set_shape, "input"_a, "min"_a, "opt"_a, "max"_a);
    py::enum_<BuilderFlag>(m, "BuilderFlag", py::arithmetic{}, BuilderFlagDoc::descr)
        .value("FP16", BuilderFlag::kFP16, BuilderFlagDoc::FP16)
        .value("DIRECT_IO", BuilderFlag::kDIRECT_IO, BuilderFlagDoc::DIRECT_IO);
    m.attr("float32") = DataType::kFLOAT;
    """
    got = parse_bindings([src])
    assert got["Builder"] == {"platform_has_tf32", "build_serialized_network"}
    assert got["IOptimizationProfile"] == {"set_shape"}
    assert got["BuilderFlag"] == {"FP16", "DIRECT_IO"}
    assert {"Builder", "IOptimizationProfile", "BuilderFlag", "float32"} <= got["module"]


# ---- runner faults found against the release sources ------------------------------------------


@pytest.mark.parametrize("version", ["8.2", "8.5"])
def test_runner_maps_types_itself_where_trt_nptype_needs_np_bool(version, fake_device, tmp_path):
    """TensorRT 8.x's trt.nptype raises AttributeError on numpy 1.24 - 1.26; the runner never calls it."""
    trt, _ = fake_device(version, TARGET_OF[version][1])
    with pytest.raises(AttributeError, match="np|numpy"):
        trt.nptype(trt.float32)
    lines: list[str] = []
    assert run_device_step(make_bundle(tmp_path / "b", version), lines)["status"] == "passed", lines
    assert "module.nptype" not in trt._state.calls


def test_engine_run_failure_is_one_line_and_exit_6(fake_device, tmp_path, monkeypatch, capsys):
    fake_device("10.3", "8.7")
    bundle = make_bundle(tmp_path / "b", "10.3")

    def refuse(self, feeds):
        raise ValueError("input 'x' shape [9, 4] is outside the engine's profile")

    monkeypatch.setattr(device.sibling("trt_runner").TensorSession, "infer", refuse)
    lines: list[str] = []
    code = device.main([str(bundle), "--latency-iters", "0"], log=lines.append)
    assert code == device.EXIT_STAGE == 6
    assert lines[-1].startswith("complete_bundle: stage failed: running the engine failed")
    assert "ValueError" in lines[-1] and "\n" not in lines[-1]


def test_engine_open_failure_of_any_binding_class_is_exit_6(fake_device, tmp_path, monkeypatch):
    fake_device("8.2", "5.3")
    bundle = make_bundle(tmp_path / "b", "8.2")

    def old_numpy(*a, **k):
        raise AttributeError("module 'numpy' has no attribute 'bool'")

    monkeypatch.setattr(device.sibling("trt_runner"), "open_session", old_numpy)
    lines: list[str] = []
    assert device.main([str(bundle), "--latency-iters", "0"], log=lines.append) == 6
    assert "cannot run the engine: AttributeError" in lines[-1]


def shape_input_onnx(path: Path) -> None:
    """x[batch,4] reshaped by an int64 shape input ``dims`` -> y (``dims`` is a shape tensor in TensorRT)."""
    node = helper.make_node("Reshape", ["x", "dims"], ["y"], name="reshape")
    graph = helper.make_graph(
        [node],
        "shape",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("dims", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.mark.parametrize("version", ["8.2", "8.5", "10.13"])
def test_shape_tensor_inputs_get_host_values(version, fake_device, tmp_path):
    trt, lib = fake_device(version, TARGET_OF[version][1])
    trt._state.shape_inputs = {"dims"}
    onnx_path = tmp_path / "m.onnx"
    shape_input_onnx(onnx_path)
    profiles = [{"x": ((1, 4), (2, 4), (4, 4)), "dims": ((2,), (2,), (2,))}]
    kw = dict(profiles=profiles, precision="fp32", strongly_typed=False, workspace_mib=64)
    with pytest.raises(adapter.EngineBuildError, match="input.s. dims are shape tensors to TensorRT"):
        adapter.build_serialized_engine(str(onnx_path), **kw)  # a profile without the values fails the build
    engine = adapter.build_serialized_engine(str(onnx_path), shape_values={"dims": ((1, 1), (4, 2), (8, 8))}, **kw)
    session = trt_runner.open_session(engine, trt, trt_runner.CudaDriver(lib))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    dims = np.array([4, 2], dtype=np.int32 if version.startswith("8") else np.int64)
    out = session.infer({"x": x, "dims": dims})
    np.testing.assert_array_equal(out["y"], x.reshape(4, 2))
    session.close()
    used = set(trt._state.calls)
    if version == "8.2":
        assert "IExecutionContext.set_shape_input" in used
    else:
        assert "ICudaEngine.is_shape_inference_io" in used


def test_host_checks_a_tensorrt_result_against_the_bundle(fake_device, tmp_path):
    """What ``deploy device run`` fetches from a TensorRT device: engine, engine.json, validation.json."""
    from edgedeploy.errors import ArtifactIntegrityError
    from edgedeploy.pipeline.device_report import device_candidates
    from edgedeploy.remote.hosts import parse_host
    from edgedeploy.remote.results import check_device_results
    from edgedeploy.remote.step import DeviceOutcome

    fake_device("10.3", "8.7")
    bundle = make_bundle(tmp_path / "b", "10.3")
    assert run_device_step(bundle, [])["status"] == "passed"
    checked = check_device_results(bundle, bundle, runner="tensorrt", host="ci@orin")
    assert checked["engine_sha256"] == hashlib.sha256((bundle / "model.engine").read_bytes()).hexdigest()
    outcome = DeviceOutcome(parse_host("ci@orin"), "tensorrt", bundle, (), checked, 0, "PASSED")
    (cand,) = device_candidates(outcome, "bundle/")
    assert cand["name"] == "tensorrt" and cand["deploy"] and cand["status"] == "passed"
    assert cand["artifact"] == "bundle/model.engine" and cand["device"]["gpu"]["sm"] == "8.7"
    with pytest.raises(ArtifactIntegrityError, match="the onnxruntime runner"):
        check_device_results(bundle, bundle, runner="onnxruntime", host="ci@orin")
    good = (bundle / "validation.json").read_text()
    forged = json.loads(good)
    forged["checks"][0]["sample"] = "0; rm -rf /"
    (bundle / "validation.json").write_text(json.dumps(forged))
    with pytest.raises(ArtifactIntegrityError, match=r"checks\[0\]\.sample must be a whole number"):
        check_device_results(bundle, bundle, runner="tensorrt", host="ci@orin")
    (bundle / "validation.json").write_text(good)
    (bundle / "model.engine").write_bytes((bundle / "model.engine").read_bytes() + b"x")  # not the engine recorded
    with pytest.raises(ArtifactIntegrityError, match="engine_sha256"):
        check_device_results(bundle, bundle, runner="tensorrt", host="ci@orin")


def test_device_host_specs():
    from edgedeploy.errors import ConfigError
    from edgedeploy.remote.hosts import assign_hosts, parse_host

    h = parse_host("jetson-orin=ci@orin-01.lab:2222")
    assert (h.target, h.user, h.hostname, h.port, h.label) == (
        "jetson-orin",
        "ci",
        "orin-01.lab",
        2222,
        "ci@orin-01.lab:2222",
    )
    assert parse_host("ci@10.0.0.7").port == 22 and parse_host("ci@[fe80::1]:22").hostname == "fe80::1"
    for bad in ("orin-01", "ci@host:0", "ci@host:x", "=ci@host"):
        with pytest.raises(ConfigError):
            parse_host(bad)
    outs = {Path("out/orin"): "jetson-orin", Path("out/gpu"): "desktop"}
    pairs = assign_hosts(outs, [parse_host("orin=ci@a"), parse_host("desktop=ci@b")])
    assert [(o.name, h.hostname) for o, h in pairs] == [("orin", "a"), ("gpu", "b")]
    with pytest.raises(ConfigError, match="no --host completes it"):
        assign_hosts(outs, [parse_host("orin=ci@a")])
    with pytest.raises(ConfigError, match="names no target"):
        assign_hosts(outs, [parse_host("ci@a"), parse_host("desktop=ci@b")])
    with pytest.raises(ConfigError, match="no output folder was built for it"):
        assign_hosts(outs, [parse_host("jetson-nano=ci@a"), parse_host("desktop=ci@b")])


def test_the_engine_is_built_from_the_model_as_verified_not_reopened_after(fake_device, tmp_path, monkeypatch):
    """TensorRT's parser opens the model by name: it gets a private copy made (and hashed) from the verified
    bytes, so a model swapped in the bundle while the parser runs is never parsed; the copies are removed."""
    fake_device("10.3", "8.7")
    bundle = make_bundle(tmp_path / "b", "10.3")
    verified_sha = hashlib.sha256((bundle / "model.onnx").read_bytes()).hexdigest()
    build = adapter.build_serialized_engine

    def swap_then_build(onnx_path, **kwargs):  # a writer racing the device step, as TensorRT opens the model
        (bundle / "model.onnx").write_bytes(b"not the verified model")
        return build(onnx_path, **kwargs)

    monkeypatch.setattr(adapter, "build_serialized_engine", swap_then_build)
    private_root = tmp_path / "tmp"
    private_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_root))
    lines: list[str] = []
    result = run_device_step(bundle, lines)
    assert result["status"] == "passed", lines
    assert result["engine"]["source_onnx_sha256"] == verified_sha
    assert list(private_root.iterdir()) == []  # the private copies are gone


def test_a_model_changed_before_its_private_copy_is_refused_and_nothing_is_left(tmp_path, monkeypatch):
    bundle = make_bundle(tmp_path / "b", "10.3")
    device.verify_bundle(str(bundle))
    private_root = tmp_path / "tmp"
    private_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_root))
    copy = Path(device.verified_copies(["model.onnx"], "build from it"))
    assert (copy / "model.onnx").read_bytes() == (bundle / "model.onnx").read_bytes()
    shutil.rmtree(copy)
    (bundle / "model.onnx").write_bytes((bundle / "model.onnx").read_bytes() + b"\0")
    with pytest.raises(device.IntegrityFailed, match="changed after the bundle was verified"):
        device.verified_copies(["model.onnx"], "build from it")
    (bundle / "model.onnx").unlink()
    (bundle / "model.onnx").symlink_to(bundle / "goldens.npz")  # a link is never followed
    with pytest.raises(device.IntegrityFailed, match="changed after the bundle was verified"):
        device.verified_copies(["model.onnx"], "build from it")
    assert list(private_root.iterdir()) == []


def test_a_dla_core_the_device_lacks_fails_the_build_naming_the_fix(fake_device, tmp_path):
    """An Orin NX 8GB has one DLA core: core 1 fails before TensorRT's own, fix-less error."""
    trt, _ = fake_device("10.3", "8.7")
    onnx_path = tmp_path / "m.onnx"
    tiny_onnx(onnx_path)
    kw = dict(profiles=[], precision="fp16", strongly_typed=False, workspace_mib=64)
    trt._state.dla_cores = 1
    with pytest.raises(adapter.EngineBuildError, match=r"DLA core 1 asked for, but this device has 1 .*--dla-core 0"):
        adapter.build_serialized_engine(str(onnx_path), dla_core=1, **kw)
    assert adapter.build_serialized_engine(str(onnx_path), dla_core=0, **kw)


def test_engine_outputs_are_copies_not_polygraphys_reused_buffers(monkeypatch):
    """polygraphy's TrtRunner reuses its host output buffers across calls: outputs kept from earlier calls (the
    device step judges all goldens after running them) must keep their own values; its errors are RuntimeError."""
    buffer = np.zeros(2, np.float32)

    class PolygraphyException(Exception):  # polygraphy's own class derives from Exception only
        pass

    class ReusingRunner:
        def __init__(self, loader):  # type: ignore[no-untyped-def]
            pass

        def activate(self) -> None:
            pass

        def infer(self, feeds):  # type: ignore[no-untyped-def]
            if "bad" in feeds:
                raise PolygraphyException("set_input_shape failed")
            buffer[:] = feeds["x"]
            return {"y": buffer[:]}  # a view of the one buffer, as polygraphy returns

    backend = types.ModuleType("polygraphy.backend.trt")
    backend.EngineFromBytes = lambda data: data  # type: ignore[attr-defined]
    backend.TrtRunner = ReusingRunner  # type: ignore[attr-defined]
    for name in ("polygraphy", "polygraphy.backend"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "polygraphy.backend.trt", backend)
    monkeypatch.setitem(sys.modules, "tensorrt", make_tensorrt("10.3"))
    session = adapter.EngineSession(b"engine")
    kept = [session.infer({"x": np.full(2, v, np.float32)}) for v in (1.0, 2.0, 3.0)]
    assert [float(k["y"][0]) for k in kept] == [1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match="PolygraphyException: set_input_shape failed"):
        session.infer({"bad": np.zeros(1)})


def test_the_plan_takes_a_shape_tensors_values_from_the_goldens(tmp_path):
    """An integer input of one fixed dim may be a shape tensor to TensorRT: the plan records the least and the
    greatest of its golden values (and the opt golden's), the box the engine is validated in."""
    from edgedeploy.config import config_from_dict
    from edgedeploy.trt.plan import BuildPlan, shape_values_from_goldens

    cfg = config_from_dict(
        {
            "model": {"factory": "m:build"},
            "inputs": [
                {"name": "x", "shape": ["batch", 4]},
                {"name": "dims", "shape": [2], "dtype": "int64", "range": [1, 8]},
            ],
            "dims": {"batch": {"min": 1, "opt": 2, "max": 4}},
            "outputs": ["y"],
            "build": {"target": "jetson-orin"},
        }
    )
    arrays = {}
    for point, dims in (("min", [1, 8]), ("opt", [4, 2]), ("max", [8, 1])):
        arrays[f"{point}/0/in/x"] = np.zeros((1, 4), np.float32)
        arrays[f"{point}/0/in/dims"] = np.array(dims, np.int64)
        arrays[f"{point}/0/out/y"] = np.zeros((1, 4), np.float32)
    np.savez(tmp_path / "goldens.npz", **arrays)
    values = shape_values_from_goldens(cfg, tmp_path / "goldens.npz")
    assert values == {"dims": ((1, 1), (4, 2), (8, 8))}
    written = BuildPlan(
        target="jetson-orin", trt_version="10.3", sm="8.7", precision="fp32", strategy="fp32", onnx="model.onnx",
        strongly_typed=False, inputs=(InputProfile("x", (1, 4), (2, 4), (4, 4)),), workspace_mib=64,
        shape_values=values,
    )  # fmt: skip
    plan = BuildPlan.from_dict(json.loads(json.dumps(written.to_dict())))
    assert plan.shape_values == values  # through plan.json and back
    assert shape_values_from_goldens(cfg, tmp_path / "none.npz") == {}


def test_the_device_step_hands_the_plans_shape_values_to_the_builder(fake_device, tmp_path, monkeypatch):
    fake_device("10.3", "8.7")
    bundle = make_bundle(tmp_path / "b", "10.3", shape_values={"n": ((1,), (2,), (3,))})
    seen = {}
    build = adapter.build_serialized_engine

    def recording(onnx_path, **kwargs):  # type: ignore[no-untyped-def]
        seen.update(kwargs)
        return build(onnx_path, **kwargs)

    monkeypatch.setattr(adapter, "build_serialized_engine", recording)
    assert run_device_step(bundle, [])["status"] == "passed"
    assert seen["shape_values"] == {"n": [[1], [2], [3]]}
    plan = json.loads((bundle / "plan.json").read_text())
    plan["shape_values"] = {"n": [[1], [2]]}
    with pytest.raises(device.BundleInputError, match="'shape_values' is not input"):
        device.plan_shape_values(plan)
