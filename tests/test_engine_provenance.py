"""Engine provenance (engine.json) and the checks before deserializing: sha256, TensorRT version, GPU SM."""

from __future__ import annotations

import hashlib
import json

import pytest

from edgedeploy import errors
from edgedeploy.cli import main
from edgedeploy.device import complete_bundle as device
from edgedeploy.errors import ArtifactIntegrityError, EngineCompatibilityError
from edgedeploy.trt.provenance import check_compatibility, check_engine, engine_record

PLAN = {
    "engine": "model.engine",
    "target": "jetson-orin",
    "precision": "int8",
    "strategy": "int8-qdq",
    "strongly_typed": False,
    "inputs": [{"name": "x", "min": [1, 3], "opt": [4, 3], "max": [8, 3]}],
    "onnx": "model.int8.onnx",
}
ORIN = {"name": "Orin", "sm": "8.7"}


def _engine(tmp_path, data: bytes = b"\x00serialized-engine", trt: str = "10.3.0.30", gpu=ORIN):
    path = tmp_path / "model.engine"
    path.write_bytes(data)
    record = engine_record(
        hashlib.sha256(data).hexdigest(), PLAN, trt_version=trt, device=gpu, onnx_sha256="ab" * 32, workspace_mib=512
    )
    (tmp_path / "engine.json").write_text(json.dumps(record))
    return path, record


def test_record_holds_what_is_needed_to_judge_an_engine(tmp_path):
    _, record = _engine(tmp_path)
    assert record["schema"] == "edgedeploy-engine/1"
    assert (record["tensorrt"], record["gpu"], record["precision"]) == ("10.3.0.30", ORIN, "int8")
    assert record["profiles"] == PLAN["inputs"] and record["source_onnx_sha256"] == "ab" * 32
    assert record["engine_sha256"] == hashlib.sha256(b"\x00serialized-engine").hexdigest()


def test_same_release_and_sm_is_compatible_even_across_build_numbers(tmp_path):
    _, record = _engine(tmp_path)
    check_compatibility(record, "10.3.0.30", ORIN)
    check_compatibility(record, "10.3.0.26", {"name": "Orin (nvgpu)", "sm": "8.7"})


@pytest.mark.parametrize(
    ("trt", "gpu", "expected"),
    [
        ("10.7.0.23", ORIN, "engine built with TensorRT 10.3.0.30, this machine runs TensorRT 10.7.0.23"),
        ("8.5.2.2", ORIN, "engine built with TensorRT 10.3.0.30, this machine runs TensorRT 8.5.2.2"),
        ("10.3.0.30", {"name": "Xavier", "sm": "7.2"}, "engine built for SM 8.7 (Orin), this GPU is SM 7.2 (Xavier)"),
        (None, ORIN, "engine needs TensorRT 10.3.0.30; TensorRT does not import here"),
        ("10.3.0.30", None, "engine built for a GPU with SM 8.7 (Orin); no CUDA GPU here"),
    ],
)
def test_mismatches_name_both_sides(tmp_path, trt, gpu, expected):
    _, record = _engine(tmp_path)
    with pytest.raises(EngineCompatibilityError) as exc:
        check_compatibility(record, trt, gpu)
    assert expected in exc.value.message
    assert exc.value.exit_code == 10


def test_engine_hash_is_checked_before_anything_loads_it(tmp_path):
    path, _ = _engine(tmp_path)
    check_engine(path, trt_version="10.3.0.30", sm="8.7")
    path.write_bytes(b"\x00serialized-engine but replaced")
    with pytest.raises(ArtifactIntegrityError, match="differs from engine.json"):
        check_engine(path, trt_version="10.3.0.30", sm="8.7")


def test_deploy_engine_check_exit_codes(tmp_path, capsys):
    path, _ = _engine(tmp_path)
    assert main(["engine", "check", str(path), "--trt-version", "10.3.0.30", "--sm", "8.7"]) == 0
    assert "sha256 verified" in capsys.readouterr().out
    assert main(["engine", "check", str(path), "--trt-version", "10.7.0.23", "--sm", "8.7"]) == 10
    err = capsys.readouterr().err
    assert "engine incompatible" in err and "10.3.0.30" in err and "10.7.0.23" in err
    (tmp_path / "engine.json").unlink()
    assert main(["engine", "check", str(path), "--trt-version", "10.3.0.30"]) == 3
    assert "no readable engine.json" in capsys.readouterr().err


def test_device_exit_codes_equal_edgedeploys():
    assert device.BundleInputError.exit_code == errors.InputError.exit_code
    assert device.BuildFailed.exit_code == errors.StageError.exit_code
    assert device.ParityFailed.exit_code == errors.ParityError.exit_code
    assert device.IntegrityFailed.exit_code == errors.ArtifactIntegrityError.exit_code
    assert device.EngineIncompatible.exit_code == errors.EngineCompatibilityError.exit_code


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        ([{"name": "x", "min": [2, 3], "opt": [2, 3], "max": [2, 3]}], []),
        ([{"name": "x", "min": [2, 3], "opt": [2, 3], "max": [2, 3], "symbolic": True}], [{"x": ((2, 3),) * 3}]),
        ([{"name": "x", "min": [1, 3], "opt": [4, 3], "max": [8, 3]}], [{"x": ((1, 3), (4, 3), (8, 3))}]),
    ],
)
def test_the_device_build_gives_a_profile_wherever_the_onnx_dims_are_symbolic(inputs, expected):
    # fixed sizes but a named ONNX dim: TensorRT's parser makes it -1, and a network with a -1 input dim and no
    # optimization profile fails its build
    assert device.plan_profiles({**PLAN, "inputs": inputs}) == expected
