"""TensorRT Q/DQ placement on a real quantized graph: a tiny residual CNN (ReLU6, SiLU, residual Add, pooling, head)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgedeploy.precision.qdq_placement import float_nodes_for_tensorrt, place_for_tensorrt, placement_findings
from edgedeploy.precision.quantize import QDQ_FLAVOURS, Quantizer
from edgedeploy.trt.plan import qdq_problems


def _residual_cnn():
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c: int, act: nn.Module) -> None:
            super().__init__()
            self.expand = nn.Conv2d(c, 2 * c, 1)
            self.act = act
            self.project = nn.Conv2d(2 * c, c, 3, padding=1)

        def forward(self, x):
            return x + self.project(self.act(self.expand(x)))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.stem_act = nn.ReLU6()
            self.blocks = nn.Sequential(Block(8, nn.ReLU6()), Block(8, nn.SiLU()), Block(8, nn.ReLU6()))
            self.head = nn.Linear(8, 5)

        def forward(self, image):
            x = self.blocks(self.stem_act(self.stem(image)))
            return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    torch.manual_seed(0)
    return Net().eval()


@pytest.fixture(scope="module")
def float_cnn(tmp_path_factory) -> Path:
    from test_calib_cache import export_onnx

    folder = tmp_path_factory.mktemp("placement")
    return export_onnx(_residual_cnn(), np.zeros((1, 3, 12, 12), np.float32), folder / "res.onnx")


def _batches(n: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"image": rng.uniform(-1, 1, (4, 3, 12, 12)).astype(np.float32)} for _ in range(n)]


def _quantize(float_cnn: Path, out: Path, flavour) -> Path:
    q = Quantizer(float_cnn, out.parent, flavour, method="minmax", float_outputs=False)
    return q.quantize(out, _batches())


def _adds(model) -> list:
    return [n for n in model.graph.node if n.op_type == "Add" and not any(i.endswith("bias") for i in n.input)]


def test_tensorrt_graph_has_no_qdq_on_conv_activation_edges_and_only_skip_inputs_of_adds(float_cnn, tmp_path):
    import onnx
    import onnxruntime as ort

    path = _quantize(float_cnn, tmp_path / "trt.int8.onnx", QDQ_FLAVOURS["tensorrt"])
    model = onnx.load(str(path))
    findings = placement_findings(model)
    assert findings == {"conv_activation_qdq": [], "add_both_quantized": [], "add_skip_float": []}
    producer = {o: n for n in model.graph.node for o in n.output}
    adds = [n for n in model.graph.node if n.op_type == "Add" and all(i in producer for i in n.input)]
    assert len(adds) == 3
    for add in adds:  # exactly one input through Q -> DQ (the skip); the other straight from the project conv
        kinds = sorted(producer[i].op_type for i in add.input)
        assert kinds == ["Conv", "DequantizeLinear"], (add.name, kinds)
    for node in model.graph.node:  # every activation reads its conv's output directly
        if node.op_type in ("Clip", "Sigmoid"):
            assert producer[node.input[0]].op_type == "Conv", node.name
    # every conv's input is still quantized (the INT8 compute is all there)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 7 and all(producer[n.input[0]].op_type == "DequantizeLinear" for n in convs)
    # pooling input and head float
    assert {n.op_type for n in model.graph.node if n.op_type in ("GlobalAveragePool", "Gemm")} == {
        "GlobalAveragePool",
        "Gemm",
    }
    for node in model.graph.node:
        if node.op_type in ("GlobalAveragePool", "Gemm"):
            assert producer[node.input[0]].op_type != "DequantizeLinear", node.name
    assert qdq_problems(path) == (True, [])  # still a Q/DQ model TensorRT takes
    feeds = _batches(1)[0]
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    ref = ort.InferenceSession(str(float_cnn), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.isfinite(got).all() and np.abs(got - ref).max() < 0.1 * np.abs(ref).max()


def test_ort_default_placement_breaks_the_rules_and_the_rewrite_fixes_it(float_cnn, tmp_path):
    """The checker sees what ORT's quantizer does by default (pairs everywhere) and the rewrite removes it."""
    import dataclasses

    import onnx

    plain = dataclasses.replace(QDQ_FLAVOURS["tensorrt"], tensorrt_placement=False)
    path = _quantize(float_cnn, tmp_path / "plain.int8.onnx", plain)
    before = placement_findings(onnx.load(str(path)))
    assert len(before["conv_activation_qdq"]) >= 4 and len(before["add_both_quantized"]) == 3
    placed = place_for_tensorrt(path)
    assert placed.to_dict() == {
        "conv_activation_edges": len(before["conv_activation_qdq"]),
        "residual_add_inputs": 3,
        "float_node_inputs": 0,
    }
    after = placement_findings(onnx.load(str(path)))
    assert after == {"conv_activation_qdq": [], "add_both_quantized": [], "add_skip_float": []}


def test_float_nodes_for_tensorrt_names_pooling_and_head(float_cnn):
    import onnx

    model = onnx.load(str(float_cnn))
    found = float_nodes_for_tensorrt(model)
    ops = {n.name: n.op_type for n in model.graph.node}
    assert sorted(ops[n] for n in found) == ["Gemm", "GlobalAveragePool"]


def test_onnxruntime_flavour_is_not_reshaped(float_cnn, tmp_path):
    import onnx

    path = _quantize(float_cnn, tmp_path / "ort.int8.onnx", QDQ_FLAVOURS["onnxruntime"])
    assert not QDQ_FLAVOURS["onnxruntime"].tensorrt_placement
    assert placement_findings(onnx.load(str(path)))["add_both_quantized"]


def test_a_residual_add_kept_float_by_the_fallback_is_not_a_placement_break(float_cnn, tmp_path):
    """A float prefix that ends past a residual Add makes the Add float: it reads float inputs by choice."""
    import onnx

    from edgedeploy.precision import analysis

    q = Quantizer(float_cnn, tmp_path, QDQ_FLAVOURS["tensorrt"], method="minmax", float_outputs=False)
    order = analysis.quantized_nodes(onnx.load(str(q.quantize(tmp_path / "all.int8.onnx", _batches()))))
    model = onnx.load(str(float_cnn))
    adds = {n.name for n in _adds(model)}
    first_add = next(i for i, n in enumerate(order) if n in adds)
    prefix = order[: first_add + 1]
    path = q.quantize(tmp_path / "prefix.int8.onnx", _batches(), exclude=prefix)
    float_add = order[first_add]
    assert placement_findings(onnx.load(str(path)))["add_skip_float"] == [float_add]
    assert placement_findings(onnx.load(str(path)), kept_float=prefix) == {
        "conv_activation_qdq": [],
        "add_both_quantized": [],
        "add_skip_float": [],
    }
