"""Float-fallback models made from the first quantized one by graph surgery (precision/float_subset.py), on a
tiny residual CNN shaped like an EfficientNet block (folded ReLU6s, a residual Add, a linear head)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from test_calib_cache import export_onnx
from test_precision import photo_batches

from edgedeploy.precision import analysis
from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess


def residual_net(width: int = 8):  # type: ignore[no-untyped-def]
    """stem conv -> ReLU6 -> [1x1 expand -> ReLU6 -> depthwise -> ReLU6 -> 1x1 project] + skip -> pool -> linear
    (``width`` channels, twice that inside the block)."""
    import torch
    from torch import nn

    wide = 2 * width

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU6())
            self.block = nn.Sequential(
                nn.Conv2d(width, wide, 1), nn.ReLU6(), nn.Conv2d(wide, wide, 3, padding=1, groups=wide), nn.ReLU6(),
                nn.Conv2d(wide, width, 1),
            )  # fmt: skip
            self.head = nn.Linear(width, 5)

        def forward(self, x):  # type: ignore[no-untyped-def]
            y = self.stem(x)
            y = y + self.block(y)
            return self.head(y.mean(dim=(2, 3)))

    torch.manual_seed(0)
    return Net()


@pytest.fixture(scope="module")
def float_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("float_subset")
    x = photo_batches(samples=8, batch=8)[0]["image"]
    return preprocess(export_onnx(residual_net(), x, folder / "raw.onnx"), folder / "float.onnx")


def _fresh(float_model: Path, work: Path, runtime: str, ranges: Path) -> Quantizer:
    """A quantizer with no earlier model to derive from (every quantization is onnxruntime's), same ranges."""
    work.mkdir(exist_ok=True)
    (work / ranges.name).write_bytes(ranges.read_bytes())
    return Quantizer(float_model, work, flavour_for(runtime), reduce_range=False)


def _reads_dq(path: Path) -> set[str]:
    """Nodes reading a DequantizeLinear output."""
    return set(analysis.quantized_nodes(onnx.load(str(path))))


@pytest.mark.parametrize("runtime", ["onnxruntime", "tensorrt"])
def test_every_float_prefix_made_by_surgery_keeps_the_rest_as_quantized_and_matches_the_quantizer(
    float_model: Path, tmp_path: Path, runtime: str
) -> None:
    batches = photo_batches(samples=16, batch=8)
    q = Quantizer(float_model, tmp_path / "derive", flavour_for(runtime), reduce_range=False)
    (tmp_path / "derive").mkdir()
    first = q.quantize(tmp_path / "all.int8.onnx", batches)
    assert list((tmp_path / "derive").glob("quantized_first.*.onnx")), "the first model is kept to derive from"
    order = analysis.quantized_nodes(onnx.load(str(first)))
    assert len(order) >= 4
    fresh = _fresh(float_model, tmp_path / "ort", runtime, tmp_path / "derive" / "ort_ranges.json")
    same = 0
    for k in range(1, len(order)):
        made = q.quantize(tmp_path / f"d{k}.int8.onnx", batches, exclude=order[:k])
        # the prefix reads float; every other node reads what it read in the first model
        assert _reads_dq(made) == set(order[k:]), (runtime, k)
        own = fresh.quantize(tmp_path / f"o{k}.int8.onnx", batches, exclude=order[:k])
        for f in (tmp_path / "ort").glob("quantized_first.*"):  # every one of ``fresh``'s is onnxruntime's own
            f.unlink()
        a, b = analysis.run_model(made, batches), analysis.run_model(own, batches)
        if _reads_dq(own) == _reads_dq(made):  # where onnxruntime quantized the same nodes: the same model
            assert all(np.array_equal(x["logits"], y["logits"]) for x, y in zip(a, b)), (runtime, k)
            same += 1
        else:  # onnxruntime also dropped the quantization of an INT8 node's input next to the float set
            assert _reads_dq(own) < _reads_dq(made), (runtime, k)
    assert same >= len(order) // 2


def test_nodes_made_float_read_float_tensors_and_all_of_them_give_the_float_model(
    float_model: Path, tmp_path: Path
) -> None:
    batches = photo_batches(samples=16, batch=8)
    q = Quantizer(float_model, tmp_path, flavour_for("onnxruntime"), reduce_range=False)
    first = q.quantize(tmp_path / "all.int8.onnx", batches)
    proto = onnx.load(str(first))
    order = analysis.quantized_nodes(proto)
    ops = {n.name: n.op_type for n in proto.graph.node}
    folded = sum(op == "Clip" for op in ops.values()) < 3  # the quantizer folded ReLU6s into Q ranges
    assert folded
    scattered = order[1::2]  # every other node: float nodes between INT8 ones, some after a folded ReLU6
    made = q.quantize(tmp_path / "scattered.int8.onnx", batches, exclude=scattered)
    assert not _reads_dq(made) & set(scattered)
    onnx.checker.check_model(onnx.load(str(made)))
    assert _reads_dq(made) & (set(order) - set(scattered))  # the others stay INT8
    # every node float: the Q/DQ pairs all go and each folded ReLU6 is applied again, so the float model's answers
    every = q.quantize(tmp_path / "every.int8.onnx", batches, exclude=order)
    kinds = {n.op_type for n in onnx.load(str(every)).graph.node}
    assert not kinds & {"QuantizeLinear", "DequantizeLinear"}
    want, got = analysis.run_model(float_model, batches), analysis.run_model(every, batches)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g["logits"], w["logits"], rtol=1e-5, atol=1e-5)


def test_a_set_without_the_first_models_float_nodes_is_quantized_afresh(float_model: Path, tmp_path: Path) -> None:
    batches = photo_batches(samples=16, batch=8)
    q = Quantizer(float_model, tmp_path / "q", flavour_for("onnxruntime"), reduce_range=False)
    (tmp_path / "q").mkdir()
    order = analysis.quantized_nodes(onnx.load(str(q.quantize(tmp_path / "all.int8.onnx", batches))))
    q.quantize(tmp_path / "first_float.int8.onnx", batches, exclude=order[:1])  # derived (a superset of none)
    # a quantizer whose first model kept node 0 float cannot make node 0 INT8 again: onnxruntime quantizes it
    q2 = _fresh(float_model, tmp_path / "q2", "onnxruntime", tmp_path / "q" / "ort_ranges.json")
    q2.quantize(tmp_path / "q2_first.int8.onnx", batches, exclude=order[:1])
    again = q2.quantize(tmp_path / "q2_second.int8.onnx", batches, exclude=order[1:2])
    assert order[0] in _reads_dq(again) and order[1] not in _reads_dq(again)
    own = _fresh(float_model, tmp_path / "q3", "onnxruntime", tmp_path / "q" / "ort_ranges.json")
    expected = own.quantize(tmp_path / "q3.int8.onnx", batches, exclude=order[1:2])
    a, b = analysis.run_model(again, batches), analysis.run_model(expected, batches)
    assert all(np.array_equal(x["logits"], y["logits"]) for x, y in zip(a, b))


@pytest.mark.parametrize("runtime", ["onnxruntime", "tensorrt"])
def test_each_node_alone_quantized_by_surgery_costs_what_the_quantizers_own_costs(
    float_model: Path, tmp_path: Path, runtime: str
) -> None:
    """The sensitivity ranking quantizes one node at a time (``only``): made from the first model too. The node
    reads its inputs and weights through Q/DQ and nothing else does (onnxruntime's own model quantizes some
    neighbours' inputs as well, and none of a ReduceMean's), so its cost at the outputs is the node's own."""
    batches = photo_batches(samples=16, batch=8)
    q = Quantizer(float_model, tmp_path / "derive", flavour_for(runtime), reduce_range=False)
    (tmp_path / "derive").mkdir()
    order = analysis.quantized_nodes(onnx.load(str(q.quantize(tmp_path / "all.int8.onnx", batches))))
    fresh = _fresh(float_model, tmp_path / "ort", runtime, tmp_path / "derive" / "ort_ranges.json")
    reference = analysis.run_model(float_model, batches)
    for i, node in enumerate(order):
        made = q.quantize(tmp_path / f"d{i}.int8.onnx", batches, only=[node])
        assert _reads_dq(made) == {node}, (runtime, node)
        own = fresh.quantize(tmp_path / f"o{i}.int8.onnx", batches, only=[node])
        ours = analysis.output_error(reference, analysis.run_model(made, batches))
        theirs = analysis.output_error(reference, analysis.run_model(own, batches))
        assert ours > 0, (runtime, node)
        if theirs > 0:  # 0: onnxruntime quantized nothing for it (a ReduceMean follows its input's quantization)
            assert ours <= 3 * theirs, (runtime, node, ours, theirs)
