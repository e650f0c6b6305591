"""Op tables follow the onnx-tensorrt importer sources where operators.md lags them (tools/gen_trt_op_tables.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgedeploy.onnxtools.opsupport import tensorrt_findings, trt_table, trt_table_versions

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("gen_trt_op_tables", ROOT / "tools" / "gen_trt_op_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(node, inits=()):
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        list(inits),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _errors(model, version):
    return [f for f in tensorrt_findings(model, trt_version=version) if f.severity == "error"]


def test_reciprocal_passes_preflight_for_jetson_nano():
    assert _errors(_model(helper.make_node("Reciprocal", ["x"], ["y"], name="recip")), "8.2") == []


def test_bicubic_resize_passes_for_xavier_but_not_for_the_nano():
    inits = [
        numpy_helper.from_array(np.array([], dtype=np.float32), "roi"),
        numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "scales"),
    ]
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], name="up", mode="cubic")
    assert _errors(_model(node, inits), "8.5") == []
    refused = _errors(_model(node, inits), "8.2")
    assert len(refused) == 1 and "mode" in refused[0].message and "'cubic'" in refused[0].message


@pytest.mark.parametrize("version", trt_table_versions())
def test_every_table_names_its_importer_source_and_disagreements(version):
    table = trt_table(version)
    assert table["importer"]["repo"] == "onnx/onnx-tensorrt" and len(table["importer"]["commit"]) == 40
    assert isinstance(table["disagreements"], list)
    for d in table["disagreements"]:
        assert {"op", "kind", "docs", "importer", "used"} <= set(d)


def test_the_generator_lets_the_importer_source_win_and_records_both_sides():
    tool = _tool()
    docs = {
        "supported": {"Resize": {"types": ["FP32"], "restrictions": "", "attributes": {"mode": ["nearest", "linear"]}}},
        "unsupported": {"Reciprocal": "not supported", "LayerNormalization": "not supported"},
    }
    source = (
        "DEFINE_BUILTIN_OP_IMPORTER(Reciprocal)\n{ return unary(kRECIP); }\n"
        'DEFINE_BUILTIN_OP_IMPORTER(Resize)\n{ if (mode == "cubic") m = nvinfer1::ResizeMode::kCUBIC; }\n'
        "DEFINE_BUILTIN_OP_IMPORTER(TRT_Scale)\n{ }\n"
    )
    spec = {"trt_version": "8.5", "importer": {"ref": "8.5-GA", "commit": "0" * 40, "path": "b.cpp", "file": "x"}}
    table = tool.apply_importer(docs, spec, tool.importer_view(spec, source))
    assert "Reciprocal" in table["supported"] and "LayerNormalization" in table["unsupported"]
    assert table["supported"]["Resize"]["attributes"]["mode"] == ["cubic", "linear", "nearest"]
    kinds = {(d["op"], d["kind"]) for d in table["disagreements"]}
    assert kinds == {("Reciprocal", "registered importer, docs unsupported"), ("Resize", "attribute value")}
    again = tool.apply_importer(table, spec, tool.importer_view(spec, source))  # idempotent on its own output
    assert json.dumps(again, sort_keys=True) == json.dumps(table, sort_keys=True)
    assert tool.docs_view(table)["unsupported"]["Reciprocal"] == "not supported"


def test_dla_findings_know_the_tensorrt_version_and_dla_generation(tmp_path):
    """Orin DLA operator matrix (TensorRT 8.5 / 8.6): Div and Softmax-on-Xavier fall back to the GPU."""
    from edgedeploy.onnxtools.opsupport import check_model
    from edgedeploy.targets import get_target

    nodes = [
        helper.make_node("Div", ["x", "x"], ["d"], name="div"),
        helper.make_node("Softmax", ["d"], ["y"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])],
    )
    path = tmp_path / "dla.onnx"
    import onnx

    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))

    def dla_ops(target):
        return {
            f.op
            for f in check_model(path, get_target(target), dla_core=0, precision="fp16")
            if "DLA cannot" in f.message
        }

    assert dla_ops("jetson-xavier") == {"Div", "Softmax"}  # TensorRT 8.5, first-generation DLA
    assert dla_ops("jetson-orin") == set()  # TensorRT 10.3, Orin DLA


@pytest.mark.parametrize(
    ("restriction", "inputs"),
    [
        ("`frame_step` and `window` must be an initializer. Input must be real-valued.", ["frame_step", "window"]),
        (
            "Inputs `max_output_boxes_per_class`, `iou_threshold`, and `score_threshold` must be initializers. "
            "Output has fixed shape and is padded to [`max_output_boxes_per_class`, 3].",
            ["iou_threshold", "max_output_boxes_per_class", "score_threshold"],
        ),
        ("Scales `scale` and biases `B` must be initializers. Input rank must be >=3 & <=5", ["B", "scale"]),
        ("`pads` must be an initializer", ["pads"]),
    ],
)
def test_generator_reads_every_input_a_restriction_names(restriction, inputs):
    assert _tool().rules_from_restrictions(restriction)["static_inputs"] == inputs


def test_shipped_tables_carry_multi_input_restrictions_and_the_10_13_opset_ceiling():
    for version in ("10.13", "10.15"):
        assert trt_table(version)["supported"]["STFT"]["static_inputs"] == ["frame_step", "window"]
    nms = trt_table("8.2")["supported"]["NonMaxSuppression"]["static_inputs"]
    assert nms == ["iou_threshold", "max_output_boxes_per_class", "score_threshold"]
    from edgedeploy.targets import get_target

    assert trt_table("10.13")["opset"][1] == get_target("desktop").max_opset == 22


def test_stft_with_a_computed_frame_step_is_refused_for_tensorrt_10_13():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["step"], name="step", axis=0),
        helper.make_node("STFT", ["x", "step", "win"], ["y"], name="stft"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
            numpy_helper.from_array(np.hanning(16).astype(np.float32), "win"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    refused = [f for f in _errors(model, "10.13") if "STFT" in f.message]
    assert len(refused) == 1 and "`frame_step`" in refused[0].message
