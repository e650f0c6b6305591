"""The ranking's one-node models reference the float model's weights in one file (precision/shared_weights.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from test_calib_cache import export_onnx
from test_precision import photo_batches
from test_precision_float_subset import residual_net

from edgedeploy.precision import analysis
from edgedeploy.precision.fallback import layer_sensitivity
from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess


def _quantizer(tmp_path: Path, runtime: str, folder: str, share: bool) -> Quantizer:
    batches = photo_batches(16, 8)
    float_model = tmp_path / "float.onnx"
    if not float_model.is_file():
        # wide enough that most weights (over a KB each) are shared, not kept inline
        preprocess(export_onnx(residual_net(64), batches[0]["image"], tmp_path / "m.onnx"), float_model)
    work = tmp_path / folder
    work.mkdir()
    q = Quantizer(float_model, work, flavour_for(runtime))
    if not share:  # every one-node model holds its float weights inline
        q._reference_float_weights = lambda out: None  # type: ignore[method-assign]
    return q


@pytest.mark.parametrize("runtime", ["onnxruntime", "tensorrt"])
def test_a_one_node_model_references_the_float_weights_and_computes_the_same(tmp_path: Path, runtime: str) -> None:
    batches = photo_batches(16, 8)
    shared, inline = (_quantizer(tmp_path, runtime, f"{runtime}-{s}", s) for s in (True, False))
    node = analysis.quantized_nodes(onnx.load(str(shared.quantize(shared.workdir / "all.onnx", batches))))[1]
    inline.quantize(inline.workdir / "all.onnx", batches)
    a = shared.quantize(shared.workdir / "one.onnx", batches, only=[node])
    b = inline.quantize(inline.workdir / "one.onnx", batches, only=[node])
    # the one-node model holds little besides its quantized node: the float weights sit in the shared file
    assert a.stat().st_size * 3 < b.stat().st_size
    assert (shared.workdir / "float_weights.bin").is_file()
    external = onnx.load(str(a), load_external_data=False)
    assert any(i.data_location == onnx.TensorProto.EXTERNAL for i in external.graph.initializer)
    # loaded with its external data, the same tensors as the model that copied them
    loaded, copied = onnx.load(str(a)), onnx.load(str(b))
    assert {i.name: onnx.numpy_helper.to_array(i).tobytes() for i in loaded.graph.initializer} == {
        i.name: onnx.numpy_helper.to_array(i).tobytes() for i in copied.graph.initializer
    }
    # and ONNX Runtime computes exactly what it computes on the inline model
    as_written = shared.flavour.qdq_as_written
    out_a = analysis.run_model(a, batches[:2], qdq_as_written=as_written)
    out_b = analysis.run_model(b, batches[:2], qdq_as_written=as_written)
    assert all(np.array_equal(x[k], y[k]) for x, y in zip(out_a, out_b) for k in x)


def test_the_ranking_is_the_same_with_the_float_weights_shared(tmp_path: Path) -> None:
    batches = photo_batches(16, 8)
    rows = []
    for share in (True, False):
        q = _quantizer(tmp_path, "tensorrt", f"rank-{share}", share)
        naive = q.quantize(q.workdir / "all.onnx", batches)
        candidates = analysis.quantized_nodes(onnx.load(str(naive)))
        reference = analysis.run_model(q.float_model, batches[:4])
        rows.append(layer_sensitivity(q, batches[:4], reference, candidates))
        assert not list(q.workdir.glob("only*.onnx"))  # each one-node model removed after its run
    assert rows[0] == rows[1] and len(rows[0]) >= 3


def test_only_tensors_equal_to_the_float_ones_byte_for_byte_are_referenced(tmp_path: Path) -> None:
    """A tensor under a float weight's name (or its float copy's) but with other values (a corrected bias, say)
    stays inline; small tensors stay inline too."""
    from onnx import helper, numpy_helper

    from edgedeploy.precision.shared_weights import SharedWeights

    rng = np.random.default_rng(0)
    w, v = (rng.standard_normal(512).astype(np.float32) for _ in range(2))
    small = np.ones(4, np.float32)

    def graph(*tensors: tuple[np.ndarray, str]) -> onnx.GraphProto:
        return helper.make_graph([], "g", [], [], [numpy_helper.from_array(a, n) for a, n in tensors])

    shared = SharedWeights(helper.make_model(graph((w, "w"), (v, "v"), (small, "s"))), tmp_path)
    other = graph((w, "w__float"), (v + 1.0, "v"), (small, "s"))
    model = helper.make_model(other)
    assert shared.externalize(model) == w.nbytes
    kinds = {i.name: i.data_location == onnx.TensorProto.EXTERNAL for i in model.graph.initializer}
    assert kinds == {"w__float": True, "v": False, "s": False}
    onnx.save(model, str(tmp_path / "m.onnx"))
    back = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "m.onnx")).graph.initializer}
    assert np.array_equal(back["w__float"], w) and np.array_equal(back["v"], v + 1.0)
