"""Graph outputs of the QDQ model stay float (precision/float_outputs.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from test_precision import photo_batches
from test_precision_equalize import _model

from edgedeploy.precision import analysis
from edgedeploy.precision.float_outputs import float_graph_outputs
from edgedeploy.precision.quantize import Quantizer, flavour_for


def _producers(path: Path) -> dict[str, str]:
    model = onnx.load(str(path))
    return {o: n.op_type for n in model.graph.node for o in n.output}


def test_quantized_model_writes_its_outputs_from_the_last_layer_in_float(tmp_path: Path) -> None:
    float_model = _model(tmp_path)
    batches = photo_batches(samples=16, batch=8)
    (tmp_path / "q").mkdir()
    for runtime in ("onnxruntime", "tensorrt"):
        q = Quantizer(float_model, tmp_path / "q", flavour_for(runtime), reduce_range=False)
        out = q.quantize(tmp_path / f"{runtime}.int8.onnx", batches)
        model = onnx.load(str(out))
        names = [o.name for o in model.graph.output]
        producers = _producers(out)
        assert all(producers[n] not in ("DequantizeLinear", "QuantizeLinear") for n in names)
        last = next(n for n in model.graph.node if names[0] in n.output)
        reads_int8 = any(producers.get(i) == "DequantizeLinear" for i in last.input)
        # ONNX Runtime: the last layer is still quantized (it reads DequantizeLinear outputs); TensorRT: the
        # classifier head stays float, where TensorRT would run it (precision/qdq_placement.py)
        assert reads_int8 == (runtime == "onnxruntime"), (runtime, last.op_type)
        onnx.checker.check_model(model)
        # the removed pair's scale and zero point go too: every initializer left is read by a node
        read = {i for n in model.graph.node for i in n.input}
        assert [i.name for i in model.graph.initializer if i.name not in read] == []
        got = analysis.run_model(out, batches)  # loads and runs in ONNX Runtime with all optimizations
        assert all(np.isfinite(g[names[0]]).all() for g in got)
    q = Quantizer(float_model, tmp_path / "q", flavour_for("onnxruntime"), reduce_range=False)
    q.float_outputs = False  # onnxruntime's own placement, kept for comparison (bench/int8_cnn_float_prefix.py)
    assert _producers(q.quantize(tmp_path / "quantized_out.int8.onnx", batches))[names[0]] == "DequantizeLinear"


def test_only_a_private_quantize_dequantize_pair_is_removed(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    def qdq_graph(extra_reader: bool) -> Path:
        nodes = [
            helper.make_node("Relu", ["x"], ["y"], name="relu"),
            helper.make_node("QuantizeLinear", ["y", "s", "z"], ["yq"], name="q"),
            helper.make_node("DequantizeLinear", ["yq", "s", "z"], ["out"], name="dq"),
        ]
        outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])]
        if extra_reader:  # the float tensor is also a graph output: renaming it would lose it
            outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]))
        inits = [
            helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]),
            helper.make_tensor("z", TensorProto.UINT8, [], [0]),
        ]
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], outputs, inits
        )
        path = tmp_path / f"m{int(extra_reader)}.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        return path

    private = qdq_graph(extra_reader=False)
    assert float_graph_outputs(private) == ["out"]
    model = onnx.load(str(private))
    assert [n.op_type for n in model.graph.node] == ["Relu"] and model.graph.node[0].output[0] == "out"
    # the float tensor is also a graph output: it stays, and a copy of it is the other output
    shared = qdq_graph(extra_reader=True)
    assert float_graph_outputs(shared) == ["out"]
    model = onnx.load(str(shared))
    assert [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node] == [
        ("Relu", ["x"], ["y"]),
        ("Identity", ["y"], ["out"]),
    ]


def test_an_output_other_nodes_read_too_is_float_and_they_keep_what_they_read(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["x"], ["y"], name="relu"),
        helper.make_node("QuantizeLinear", ["y", "s", "z"], ["yq"], name="q"),
        helper.make_node("DequantizeLinear", ["yq", "s", "z"], ["logits"], name="dq"),
        helper.make_node("ArgMax", ["logits"], ["label"], name="argmax", axis=1, keepdims=0),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4]),
        helper.make_tensor_value_info("label", TensorProto.INT64, [1]),
    ]
    inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.5]), helper.make_tensor("z", TensorProto.UINT8, [], [0])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])], outputs, inits
    )
    path = tmp_path / "argmax.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert float_graph_outputs(path) == ["logits"]
    onnx.checker.check_model(onnx.load(str(path)))
    x = np.array([[0.1, 1.1, 1.2, 0.0]], np.float32)  # on the 0.5 grid both are 1.0: ArgMax would say 1
    (got,) = analysis.run_model(path, [{"x": x}])
    np.testing.assert_array_equal(got["logits"], x)  # float, not on the 0.5 grid
    assert int(got["label"][0]) == 2  # the ArgMax reads the float logits too: 1.2 beats 1.1
    assert [n.op_type for n in onnx.load(str(path)).graph.node] == ["Relu", "ArgMax"]  # the pair is gone
