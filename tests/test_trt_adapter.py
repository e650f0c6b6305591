"""The TensorRT adapter without TensorRT (clear errors, version parsing), the OOM retry policy, and a real
engine build where TensorRT and a GPU exist (marked ``tensorrt``)."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy.device import complete_bundle as device
from edgedeploy.errors import StageError
from edgedeploy.trt import adapter

HAS_TRT = adapter.tensorrt_version() is not None  # find_spec is fooled by tensorrt-stubs' bare namespace


def test_version_tuple_and_oom_detection():
    assert adapter.version_tuple("10.3.0.30") == (10, 3, 0, 30)
    assert adapter.version_tuple("8.5.2.2") == (8, 5, 2, 2)
    assert adapter.version_tuple("11.5.0rc1") == (11, 5, 0)
    assert adapter._looks_like_oom(["[E] Error Code 1: Cuda Runtime (out of memory)"])
    assert adapter._looks_like_oom(["Requested amount of GPU memory (4294967296 bytes) could not be allocated"])
    assert not adapter._looks_like_oom(["Network has dynamic or shape inputs, but no optimization profile"])


@pytest.mark.skipif(HAS_TRT, reason="checks the message shown where TensorRT is absent")
def test_without_tensorrt_the_adapter_says_so():
    assert adapter.tensorrt_version() is None
    with pytest.raises(adapter.TensorRTUnavailable, match="TensorRT Python bindings (do not import|are not installed)"):
        adapter.build_serialized_engine("m.onnx", profiles=[], precision="fp32", strongly_typed=False, workspace_mib=64)


def test_retry_halves_the_workspace_on_out_of_memory_and_says_so():
    calls, lines = [], []

    def fake_build(workspace: int) -> bytes:
        calls.append(workspace)
        if workspace > 256:
            raise adapter.BuildOutOfMemoryError(f"engine build ran out of memory at {workspace}")
        return b"engine-bytes"

    data, used, tried = device.build_with_retry(fake_build, 1024, log=lines.append)
    assert (data, used, tried, calls) == (b"engine-bytes", 256, [1024, 512, 256], [1024, 512, 256])
    assert lines == [
        "engine build ran out of memory with a 1024 MiB workspace; retrying with 512 MiB",
        "engine build ran out of memory with a 512 MiB workspace; retrying with 256 MiB",
    ]


def test_retry_gives_up_at_the_floor_naming_every_size_and_lets_other_errors_through():
    def always_oom(workspace: int) -> bytes:
        raise adapter.BuildOutOfMemoryError("out of memory")

    with pytest.raises(device.BuildFailed, match=r"every workspace tried \(256, 128, 64 MiB\)") as exc:
        device.build_with_retry(always_oom, 256, min_workspace_mib=64, log=lambda s: None)
    assert exc.value.exit_code == StageError.exit_code

    def parse_error(workspace: int) -> bytes:
        raise adapter.EngineBuildError("TensorRT cannot parse model.onnx: unsupported op")

    with pytest.raises(adapter.EngineBuildError, match="cannot parse"):
        device.build_with_retry(parse_error, 256, log=lambda s: None)


@pytest.mark.tensorrt
def test_adapter_builds_and_runs_a_real_engine(tmp_path):
    pytest.importorskip("tensorrt")
    if not HAS_TRT or adapter.cuda_device() is None:
        pytest.skip("no TensorRT bindings or no CUDA GPU")
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(tmp_path / "m.onnx"))
    cache = tmp_path / "timing.cache"
    data = adapter.build_serialized_engine(
        str(tmp_path / "m.onnx"),
        profiles=[{"x": ((1, 4), (2, 4), (4, 4))}],
        precision="fp32",
        strongly_typed=False,
        workspace_mib=64,
        timing_cache=str(cache),
    )
    assert cache.is_file() and cache.stat().st_size > 0
    session = adapter.EngineSession(data)
    x = np.array([[-1.0, 2.0, -3.0, 4.0]] * 3, dtype=np.float32)
    np.testing.assert_array_equal(session.infer({"x": x})["y"], np.maximum(x, 0))
    session.close()
