"""Builds without a config file: ``--factory`` with ``--input`` (and ``--checkpoint``), and ``--onnx`` for a model
that exists only as ONNX, judged against ONNX Runtime FP32 of that model. Real tiny models, real ONNX Runtime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.cli import main

FAST = ["--samples", "1", "--latency-iters", "1", "--latency-warmup", "0"]


def tiny_onnx(path: Path, *, batch: str | int = "N", size: int = 8) -> Path:
    """Conv, Relu, GlobalAveragePool, Flatten, Gemm: input ``image`` [batch, 3, size, size], output ``scores``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "conv_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "conv_b"),
        numpy_helper.from_array(rng.normal(0, 0.5, (5, 4)).astype(np.float32), "fc_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (5,)).astype(np.float32), "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["scores"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batch, 5])],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def photos(folder: Path, n: int = 24, size: int = 8) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i:02d}.png")
    return folder


def test_factory_and_input_flags_build_without_a_config(tiny_project: Path, tmp_path: Path, monkeypatch) -> None:
    project = tiny_project.parent
    module = next(p.stem for p in project.glob("tinynet_*.py"))
    monkeypatch.chdir(project)  # the factory's module is found from the working directory, as a user runs it
    out = tmp_path / "quick"
    code = main(["build", "--factory", f"{module}:build", "--input", "image:batchx3x16x16", "--dim", "batch=1:2:3",
                 "--output", "logits", "--checkpoint", "tiny.safetensors", "--target", "cpu", "--exporter",
                 "torchscript", "--out", str(out), *FAST])  # fmt: skip
    assert code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["inputs"][0]["shape"] == ["batch", 3, 16, 16]
    assert manifest["config"]["dims"]["batch"] == {"min": 1, "opt": 2, "max": 3}
    assert manifest["inputs"]["checkpoint"]["path"].endswith("tiny.safetensors")
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "passed" and report["parity"]["reference"] == "pytorch-eager"


def test_factory_without_inputs_or_dim_sizes_names_the_flag(capsys) -> None:
    assert main(["build", "--factory", "m:build"]) == 2
    assert "--input NAME:SHAPE" in capsys.readouterr().err
    assert main(["build", "--factory", "m:build", "--input", "image:batchx3x8x8"]) == 2
    assert "add --dim batch=MIN:OPT:MAX" in capsys.readouterr().err
    assert main(["build", "--factory", "m:build", "--input", "image"]) == 2
    assert "expected NAME:SHAPE[:DTYPE]" in capsys.readouterr().err


def test_onnx_model_builds_int8_against_its_own_fp32_run(tmp_path: Path) -> None:
    model = tiny_onnx(tmp_path / "m.onnx")
    out = tmp_path / "out"
    code = main(["build", "--onnx", str(model), "--target", "cpu", "--precision", "int8", "--calib",
                 str(photos(tmp_path / "data")), "--out", str(out), *FAST])  # fmt: skip
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "passed"
    assert report["parity"]["reference"].startswith("onnxruntime-fp32")
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[1] / "docs" / "report.schema.json").read_text())
    jsonschema.validate(report, schema)  # the documented schema covers a build from --onnx too
    deployed = next(c for c in report["parity"]["candidates"] if c.get("deploy"))
    assert deployed["name"] == "onnxruntime-int8" and deployed["status"] == "passed"
    assert (out / "model.int8.onnx").is_file()
    stages = [s["name"] for s in report["stages"]]
    assert "capture" not in stages  # nothing of PyTorch runs
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["inputs"][0] == {**manifest["config"]["inputs"][0], "name": "image", "dtype": "float32"}
    assert manifest["config"]["outputs"] == ["scores"] and manifest["config"]["dims"]["N"]["max"] == 1


def test_onnx_model_outputs_renamed_and_dims_from_flags(tmp_path: Path) -> None:
    import onnx

    model = tiny_onnx(tmp_path / "m.onnx")
    out = tmp_path / "out"
    code = main(["build", "--onnx", str(model), "--dim", "N=1:2:4", "--output", "logits", "--out", str(out), *FAST])
    assert code == 0
    built = onnx.load(str(out / "model.onnx"))
    assert [o.name for o in built.graph.output] == ["logits"]
    report = json.loads((out / "report.json").read_text())
    fp32 = next(c for c in report["parity"]["candidates"] if c["name"] == "onnxruntime-fp32")
    assert {c["shape"] for c in fp32["checks"]} >= {"min", "max", "x4"}  # batch 1..4 judged, repeated rows too


@pytest.mark.parametrize(
    ("extra", "code", "needle"),
    [
        (["--checkpoint", "w.safetensors"], 2, "model.checkpoint does not apply to model.onnx"),
        (["--output", "a", "--output", "b"], 2, "has 1 output(s) (scores), the config names 2"),
        (["--factory", "m:build"], 2, "set one of model.onnx, model.factory and model.hf"),
        (["--exporter", "dynamo", "--opset", "17"], 2, "export.exporter, export.opset do(es) not apply to model.onnx"),
    ],
)
def test_onnx_flag_conflicts_are_refused_at_once(tmp_path: Path, capsys, extra, code, needle) -> None:
    model = tiny_onnx(tmp_path / "m.onnx")
    assert main(["build", "--onnx", str(model), "--out", str(tmp_path / "out"), *extra]) == code
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_onnx_file_problems_are_input_errors(tmp_path: Path, capsys) -> None:
    assert main(["build", "--onnx", str(tmp_path / "missing.onnx")]) == 3
    assert "file not found" in capsys.readouterr().err
    (tmp_path / "junk.onnx").write_bytes(b"\x00\x01 not protobuf at all")
    assert main(["build", "--onnx", str(tmp_path / "junk.onnx")]) == 3
    assert "not a readable ONNX model" in capsys.readouterr().err
    dynamic_hw = tiny_onnx(tmp_path / "hw.onnx")
    import onnx

    proto = onnx.load(str(dynamic_hw))
    proto.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "height"
    onnx.save(proto, str(dynamic_hw))
    assert main(["build", "--onnx", str(dynamic_hw)]) == 2
    assert "pass --dim height=MIN:OPT:MAX" in capsys.readouterr().err


def test_an_onnx_model_whose_weights_point_outside_its_folder_is_refused_unread(tmp_path: Path, capsys) -> None:
    import onnx
    from onnx import TensorProto

    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.zeros(4 * 3 * 3 * 3, np.float32).tobytes())  # a file the model has no business reading
    folder = tmp_path / "model"
    folder.mkdir()
    proto = onnx.load(str(tiny_onnx(folder / "m.onnx")))
    weight = next(t for t in proto.graph.initializer if t.name == "conv_w")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value="../secret.bin")
    onnx.save(proto, str(folder / "m.onnx"))
    for argv in (["build", "--onnx", str(folder / "m.onnx"), "--out", str(tmp_path / "out")],
                 ["check", "--onnx", str(folder / "m.onnx"), "--target", "cpu"]):  # fmt: skip
        assert main(argv) == 3
        err = capsys.readouterr().err
        assert "tensor 'conv_w' keeps its data at '../secret.bin', outside the model's folder" in err
    assert not (tmp_path / "out").exists()


def test_an_onnx_model_onnxruntime_cannot_run_is_an_operator_error_naming_the_op(tmp_path: Path, capsys) -> None:
    import onnx
    from onnx import helper

    proto = onnx.load(str(tiny_onnx(tmp_path / "m.onnx")))
    relu = next(n for n in proto.graph.node if n.op_type == "Relu")
    relu.op_type, relu.domain = "Frobnicate", "com.example"
    proto.opset_import.append(helper.make_opsetid("com.example", 1))
    onnx.save(proto, str(tmp_path / "m.onnx"))
    assert main(["build", "--onnx", str(tmp_path / "m.onnx"), "--out", str(tmp_path / "out"), *FAST]) == 5
    assert "(Frobnicate)" in capsys.readouterr().err
