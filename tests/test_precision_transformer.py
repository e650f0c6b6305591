"""Transformer INT8: a tiny random-weight nn.TransformerEncoderLayer with an additive -1e9 key-padding mask,
exported to ONNX and quantized for real in ONNX Runtime (dynamic for cpu, static Q/DQ for TensorRT)."""

from __future__ import annotations

import json
import textwrap
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest

import edgedeploy
from edgedeploy.errors import ConfigError
from edgedeploy.precision import heldout, ranges, transformer
from edgedeploy.precision.analysis import run_model

# one xdist worker runs this module, so its module-scoped build fixture runs once (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_precision_transformer")

TINY_TF = textwrap.dedent(
    """
    import torch
    from torch import nn


    class TinyEncoder(nn.Module):
        def __init__(self, vocab=50, dim=32, heads=4, ffn=64, classes=8, mask_into_head=False):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.layer = nn.TransformerEncoderLayer(dim, heads, ffn, dropout=0.0, activation="gelu", batch_first=True)
            self.head = nn.Linear(dim, classes)
            self.mask_into_head = mask_into_head

        def forward(self, input_ids, attention_mask):
            keep = attention_mask.to(torch.float32)
            bias = (1.0 - keep) * -1e9  # the additive mask, as hand-written attention code does it
            h = self.layer(self.embed(input_ids), src_key_padding_mask=bias)
            if self.mask_into_head:  # a weight MatMul reading a mask-carrying tensor
                return self.head(h + bias[..., None]).amax(1)
            pooled = (h * keep[..., None]).sum(1) / keep.sum(1, keepdim=True).clamp(min=1.0)
            return self.head(pooled)


    def build(mask_into_head=False):
        return TinyEncoder(mask_into_head=mask_into_head)
    """
)


def _tiny(tmp_path: Path, *, mask_into_head: bool = False, seed: int = 0) -> Path:
    import torch

    ns: dict = {}
    exec(compile(TINY_TF, "tiny_tf.py", "exec"), ns)  # the test's own model source
    torch.manual_seed(seed)
    model = ns["build"](mask_into_head=mask_into_head).eval()
    ids = torch.randint(0, 50, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.int64)
    path = tmp_path / f"tiny_tf_{int(mask_into_head)}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on nn.MultiheadAttention's shape checks
        torch.onnx.export(
            model,
            (ids, mask),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["input_ids", "attention_mask"],
            output_names=["logits"],
            dynamic_axes={"input_ids": {0: "b"}, "attention_mask": {0: "b"}},
        )
    return path


def _batches(n: int, *, seed: int, padded: bool = True) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        mask = np.ones((2, 12), np.int64)
        if padded:
            mask[0, rng.integers(4, 12) :] = 0  # a padded sentence next to a full one
        out.append({"input_ids": rng.integers(0, 50, (2, 12)).astype(np.int64), "attention_mask": mask})
    return out


def _ops_by_output(model) -> dict[str, object]:
    return {o: n for n in model.graph.node for o in n.output}


@pytest.fixture(scope="module")
def tiny_tf(tmp_path_factory) -> Path:
    return _tiny(tmp_path_factory.mktemp("tf"))


def test_recipe_detection_tells_transformer_from_cnn(tiny_tf: Path, tmp_path: Path) -> None:
    import onnx
    import torch

    recipe, evidence = transformer.choose_recipe("auto", onnx.load(str(tiny_tf)))
    assert recipe == "transformer"
    assert evidence["softmax"] == 1 and evidence["layernorm"] == 2 and evidence["activation_matmuls"] == 2
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 36, 5))
    path = tmp_path / "cnn.onnx"
    torch.onnx.export(cnn.eval(), (torch.zeros(1, 3, 8, 8),), str(path), dynamo=False, opset_version=17)
    assert transformer.choose_recipe("auto", onnx.load(str(path)))[0] == "cnn"
    assert transformer.choose_recipe("transformer", onnx.load(str(path)))[0] == "transformer"  # explicit wins


def test_mask_tensors_found_from_graph_and_from_ranges(tiny_tf: Path, tmp_path: Path) -> None:
    import onnx

    model = onnx.load(str(tiny_tf))
    static = ranges.mask_constant_tensors(model)
    softmax_in = next(n.input[0] for n in model.graph.node if n.op_type == "Softmax")
    assert softmax_in in static and all("-1e+09" in why for why in static.values())
    softmax_out = next(n.output[0] for n in model.graph.node if n.op_type == "Softmax")
    assert softmax_out not in static  # the mask stops at the softmax

    stats = ranges.collect_ranges(tiny_tf, _batches(4, seed=1), tmp_path)
    found = ranges.absurd_ranges(stats)  # from the calibrated ranges alone
    assert softmax_in in found and found[softmax_in]["range"][0] == pytest.approx(-1e9, rel=1e-3)
    ordinary = [t for t, s in stats.items() if t not in static and s.absmax < 100]
    assert ordinary and not set(ordinary) & set(found)

    # calibration without padding hides the mask from the ranges; the graph still shows it
    unpadded = ranges.collect_ranges(tiny_tf, _batches(4, seed=1, padded=False), tmp_path)
    assert softmax_in not in ranges.absurd_ranges(unpadded)
    assert softmax_in in ranges.absurd_ranges(unpadded, model)


def test_cpu_dynamic_int8_quantizes_weights_only_and_holds_out(tiny_tf: Path, tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    out = tmp_path / "int8.onnx"
    batches = _batches(16, seed=2)
    result, plan, _ = transformer.quantize_transformer(
        tiny_tf, out, tmp_path, scheme=transformer.scheme_for("onnxruntime"), batches=batches, accuracy_target=0.99
    )
    q = onnx.load(str(out))
    ops = [n.op_type for n in q.graph.node]
    # all five weight MatMuls/Gemms (two Gemms rewritten) run as integer MatMuls with int8 per-channel weights
    assert plan["weight_matmuls"] == 5 and len(plan["gemms_rewritten_as_matmul"]) == 2
    assert ops.count("MatMulInteger") == 5 and "Gemm" not in ops
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    for n in q.graph.node:
        if n.op_type == "MatMulInteger":
            assert inits[n.input[1]].dtype == np.int8 and inits[n.input[1]].ndim == 2
            assert inits[n.input[3]].size > 1  # per-channel zero points (one per output column)
    # softmax, LayerNorm, GELU and the mask arithmetic stay float, fed by float tensors
    made_by = _ops_by_output(q)
    for n in q.graph.node:
        if n.op_type in ("Softmax", "LayerNormalization", "Erf"):
            assert made_by[n.input[0]].op_type not in ("DynamicQuantizeLinear", "DequantizeLinear", "MatMulInteger")
    assert ops.count("Softmax") == 1 and ops.count("LayerNormalization") == 2 and ops.count("Erf") == 1
    quantized_inputs = {n.input[0] for n in q.graph.node if n.op_type == "DynamicQuantizeLinear"}
    assert not quantized_inputs & {a["tensor"] for a in plan["absurd_ranges"]}
    assert any(a["range"] and a["range"][0] < -1e8 for a in plan["absurd_ranges"])  # listed in precision.json
    # judged on batches never used for ranges: the last quarter, as the goldens
    assert plan["held_out"] == {**plan["held_out"], "batches": 4, "calibration_batches": 12, "disjoint": True}
    assert result.met and result.tries[-1]["samples"] == 8
    # and it holds up on fresh held-out inputs too
    fresh = _batches(8, seed=99)
    score = heldout.held_out_score(run_model(tiny_tf, fresh), run_model(out, fresh))
    assert score["metric"] == "cosine" and score["score"] >= 0.99 and score["outputs"]["logits"]["min"] > 0.97


def test_tensorrt_static_qdq_on_matmul_inputs_only(tiny_tf: Path, tmp_path: Path) -> None:
    import onnx

    from edgedeploy.trt.plan import qdq_problems

    out = tmp_path / "qdq.onnx"
    result, plan, q = transformer.quantize_transformer(
        tiny_tf, out, tmp_path, scheme=transformer.scheme_for("tensorrt"), batches=_batches(12, seed=3)
    )
    model = onnx.load(str(out))
    is_qdq, problems = qdq_problems(out)
    assert is_qdq and problems == []  # symmetric int8, as TensorRT takes it
    readers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.op_type)
    dq_out = [n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert dq_out and all(set(readers[o]) <= {"MatMul", "Gemm"} for o in dq_out)
    quantized = {n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[0] in dq_out}
    assert len(quantized) == plan["weight_matmuls"] == 5  # Gemms kept as Gemms for TensorRT
    assert plan["scheme"]["activations"] == "calibrated" and result.met
    assert q.ranges() and not set(q.ranges()) & {a["tensor"] for a in plan["absurd_ranges"]}


def test_weight_matmul_reading_a_mask_tensor_is_kept_float(tmp_path: Path) -> None:
    import onnx

    path = _tiny(tmp_path, mask_into_head=True)
    out = tmp_path / "int8.onnx"
    result, plan, _ = transformer.quantize_transformer(
        path, out, tmp_path, scheme=transformer.scheme_for("onnxruntime"), batches=_batches(8, seed=4)
    )
    head = [n for n, why in result.kept_float.items() if "mask constant" in why]
    assert len(head) == 1 and head[0].startswith("/head/") and head[0] not in result.quantized
    q = onnx.load(str(out))
    assert next(n for n in q.graph.node if n.name == head[0]).op_type == "MatMul"  # float, not MatMulInteger
    assert len(result.quantized) == plan["weight_matmuls"] - 1 == 4


def test_smoothing_is_exact_in_float_and_flattens_outlier_channels(tiny_tf: Path, tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    from edgedeploy.precision.smoothquant import smooth

    model = onnx.load(str(tiny_tf))
    # give the first LayerNorm output an outlier channel (its scale 30x on channel 0), as BERTs have
    ln = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    gamma = next(i for i in model.graph.initializer if i.name == ln.input[1])
    g = numpy_helper.to_array(gamma).copy()
    g[0] *= 30.0
    gamma.CopyFrom(numpy_helper.from_array(g, gamma.name))
    base = tmp_path / "outlier.onnx"
    onnx.save(model, str(base))
    nodes = transformer.weight_matmuls(model)
    acts = {n.input[0] for n in model.graph.node if n.name in nodes}
    batches = _batches(4, seed=5)
    stats = ranges.collect_ranges(base, batches, tmp_path, channel_tensors=acts)
    rows = smooth(model, stats, nodes, alpha=0.5)
    smoothed = tmp_path / "smoothed.onnx"
    onnx.save(model, str(smoothed))
    for ref, got in zip(run_model(base, batches), run_model(smoothed, batches)):
        np.testing.assert_allclose(got["logits"], ref["logits"], rtol=1e-4, atol=1e-4)
    by_tensor = {r["tensor"]: r for r in rows}
    row = by_tensor[ln.output[0]]
    assert row["channel_outlier_ratio_before"] > 5 * row["channel_outlier_ratio_after"]
    assert any(r["how"] == "Mul inserted" for r in rows)  # activations that also feed a residual Add


def test_fallback_keeps_the_most_sensitive_matmuls_float(tiny_tf: Path, tmp_path: Path) -> None:
    out = tmp_path / "int8.onnx"
    result, plan, _ = transformer.quantize_transformer(
        tiny_tf,
        out,
        tmp_path,
        scheme=transformer.scheme_for("onnxruntime"),
        batches=_batches(8, seed=7),
        accuracy_target=1.0,  # unreachable: every try runs
        max_tries=2,
    )
    assert not result.met and [t["float_matmuls"] for t in result.tries] == [0, 1, 2]
    errors = [r["output_error"] for r in result.sensitivity]
    assert len(errors) == 5 and errors == sorted(errors, reverse=True) and errors[0] > 0
    assert set(result.kept_float) == {r["node"] for r in result.sensitivity[:2]}
    assert all(why.startswith("INT8 sensitive") for why in result.kept_float.values())
    assert result.tries[-1]["score"] > result.tries[0]["score"]


def test_fallback_starts_where_the_ranking_predicts_and_bisects_to_the_smallest_passing_set(
    tiny_tf: Path, tmp_path: Path
) -> None:
    batches = _batches(16, seed=7)
    scheme = transformer.scheme_for("onnxruntime")
    every, _, _ = transformer.quantize_transformer(
        tiny_tf, tmp_path / "all.onnx", tmp_path, scheme=scheme, batches=batches, accuracy_target=1.0, max_tries=8
    )
    # an unreachable target predicts nothing: sizes double from 1 until every ranked MatMul is float
    assert [t["float_matmuls"] for t in every.tries] == [0, 1, 2, 4, 5] and not every.met
    assert every.start["predicted"] is None and "every ranked MatMul float (5)" in every.stop
    # the all-INT8 try cannot reach 1.0 after its first held-out batch: judged no further
    assert every.tries[0]["judged_samples"] < every.tries[0]["samples"]
    target = next(t["score"] for t in every.tries if t["float_matmuls"] == 4)  # 4 float meets it, fewer do not
    result, plan, _ = transformer.quantize_transformer(
        tiny_tf, tmp_path / "q.onnx", tmp_path, scheme=scheme, batches=batches, accuracy_target=target
    )
    sizes = [t["float_matmuls"] for t in result.tries]
    # the ranking's prediction skips the sizes it says hold too little of the error; a passing start is then
    # bisected down from zero, and the smallest passing set ships, not the last try
    assert result.start["size"] == sizes[1] == 4 and result.start["predicted"] >= 4
    assert sizes == [0, 4, 2, 3] and [t["met"] for t in result.tries] == [False, True, False, False]
    assert result.met and result.final is result.tries[1] and result.final["float_matmuls"] == 4
    assert len(result.kept_float) == 4 and "smallest passing set found: 4 float, 3 failed" in result.stop


def test_where_surgery_cannot_make_a_model_the_search_quantizes_it_again_to_the_same_verdicts(
    tiny_tf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgedeploy.precision import matmul_switch

    batches = _batches(16, seed=7)
    scheme = transformer.scheme_for("onnxruntime")
    made: list[str] = []
    real = transformer.TransformerQuantizer.quantize

    def counted(q: transformer.TransformerQuantizer, out: Path, nodes: list[str]) -> Path:
        made.append(out.name)
        return real(q, out, nodes)

    monkeypatch.setattr(transformer.TransformerQuantizer, "quantize", counted)
    cut, _, _ = transformer.quantize_transformer(
        tiny_tf, tmp_path / "cut.onnx", tmp_path, scheme=scheme, batches=batches, accuracy_target=0.999993
    )
    assert made == ["tf0.int8.onnx"] and len(cut.tries) > 2  # one quantization; every other model by surgery
    made.clear()
    monkeypatch.setattr(matmul_switch, "derivable", lambda *_args: False)
    again, _, _ = transformer.quantize_transformer(
        tiny_tf, tmp_path / "again.onnx", tmp_path, scheme=scheme, batches=batches, accuracy_target=0.999993
    )
    assert len(made) == 1 + 5 + len(again.tries) - 1  # the first, one per ranked MatMul, one per try
    assert [(t["float_matmuls"], t["score"]) for t in cut.tries] == [
        (t["float_matmuls"], t["score"]) for t in again.tries
    ]
    assert [r["node"] for r in cut.sensitivity] == [r["node"] for r in again.sensitivity]
    for a, b in zip(cut.sensitivity, again.sensitivity):
        assert a["output_error"] == pytest.approx(b["output_error"], rel=1e-4)


def test_a_spent_time_budget_stops_the_transformer_search_and_says_so(tiny_tf: Path, tmp_path: Path) -> None:
    import time

    result, _, _ = transformer.quantize_transformer(
        tiny_tf, tmp_path / "q.onnx", tmp_path, scheme=transformer.scheme_for("onnxruntime"),
        batches=_batches(8, seed=7), accuracy_target=1.0, deadline=time.monotonic(),
    )  # fmt: skip
    # ranked, but no try starts once the deadline has passed; the stop names the setting, not the tries
    assert [t["float_matmuls"] for t in result.tries] == [0] and len(result.sensitivity) == 5
    assert result.stop == "precision.time_budget_s spent before any try passed" and result.tries_spent
    assert not result.met and result.final is result.tries[0]


@pytest.mark.parametrize("runtime", ["onnxruntime", "tensorrt"])
def test_fallback_models_are_made_from_the_first_quantization_by_surgery(
    tiny_tf: Path, tmp_path: Path, runtime: str
) -> None:
    import onnx

    from edgedeploy.precision import matmul_switch
    from edgedeploy.precision.analysis import batch_runner, output_error

    scheme = transformer.scheme_for(runtime)
    model = onnx.load(str(tiny_tf))
    for i, n in enumerate(model.graph.node):
        n.name = n.name or f"{n.op_type}_{i}"
    if scheme.activations == "dynamic":
        transformer.gemms_to_matmuls(model)
    nodes = transformer.weight_matmuls(model)
    if scheme.activations == "calibrated":
        transformer.isolate_matmul_inputs(model, nodes)
    base = tmp_path / "float.onnx"
    onnx.save(model, str(base))
    q = transformer.TransformerQuantizer(base, tmp_path, scheme, _batches(8, seed=11))
    first = q.quantize(tmp_path / "all.onnx", nodes)
    quantized, float_model = onnx.load(str(first)), onnx.load(str(base))
    assert matmul_switch.derivable(quantized, float_model, nodes)
    assert not matmul_switch.derivable(quantized, float_model, [*nodes, "no such node"])
    feeds = _batches(4, seed=12)
    as_written = scheme.qdq_as_written

    # a fallback try: the quantizer's own model for that set, to the bit, with nothing of the float ones left
    keep = [nodes[0], nodes[3]]
    derived = onnx.ModelProto()
    derived.CopyFrom(quantized)
    assert matmul_switch.float_matmuls(derived, float_model, [n for n in nodes if n not in keep]) == 3
    onnx.save(derived, str(tmp_path / "derived.onnx"))
    again = onnx.load(str(q.quantize(tmp_path / "again.onnx", keep)))
    got = run_model(tmp_path / "derived.onnx", feeds, qdq_as_written=as_written)
    want = run_model(tmp_path / "again.onnx", feeds, qdq_as_written=as_written)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a["logits"], b["logits"])
    assert sorted(n.op_type for n in derived.graph.node) == sorted(n.op_type for n in again.graph.node)
    assert sorted(i.name for i in derived.graph.initializer) == sorted(i.name for i in again.graph.initializer)

    # the ranking's one model: every gate off computes the float model, one gate on that MatMul alone in INT8
    switched = onnx.ModelProto()
    switched.CopyFrom(quantized)
    gates = matmul_switch.switch_model(switched, float_model, nodes)
    onnx.save(switched, str(tmp_path / "switch.onnx"))
    run = batch_runner(tmp_path / "switch.onnx", qdq_as_written=as_written)
    off = {gate: np.array(False) for gate in gates.values()}
    reference = run_model(base, feeds)
    assert output_error(reference, run([{**b, **off} for b in feeds])) < 1e-6
    for node in (nodes[0], nodes[-1]):
        alone = run_model(q.quantize(tmp_path / "alone.onnx", [node]), feeds, qdq_as_written=as_written)
        on = run([{**b, **off, gates[node]: np.array(True)} for b in feeds])
        assert output_error(alone, on) < 1e-5 < output_error(reference, on)


def test_a_matmul_put_back_in_float_reads_float_where_another_int8_matmul_shares_its_input(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgedeploy.precision import matmul_switch

    # x feeds two weight MatMuls (attention's query and key read one LayerNorm output), as isolated for TensorRT
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=(8, 8)).astype(np.float32), f"w{i}") for i in (1, 2)]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["y1"], name="m1"),
            helper.make_node("MatMul", ["x", "w2"], ["y2"], name="m2"),
            helper.make_node("Add", ["y1", "y2"], ["y"], name="add"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8])],
        weights,
    )
    base = tmp_path / "shared.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(base))
    calib = [{"x": rng.normal(size=(4, 8)).astype(np.float32)} for _ in range(4)]
    q = transformer.TransformerQuantizer(base, tmp_path, transformer.scheme_for("tensorrt"), calib)
    quantized, float_model = onnx.load(str(q.quantize(tmp_path / "all.onnx", ["m1", "m2"]))), onnx.load(str(base))
    assert matmul_switch.float_matmuls(quantized, float_model, ["m2"]) == 1
    nodes = {n.name: n for n in quantized.graph.node}
    made_by = _ops_by_output(quantized)
    # m1 stays INT8 (it reads the DequantizeLinear of x); m2 reads x itself, not the quantized copy m1 reads
    assert made_by[nodes["m1"].input[0]].op_type == "DequantizeLinear" and nodes["m2"].input[0] == "x"
    assert nodes["m2"].input[1] == "w2" and made_by[nodes["m1"].input[1]].op_type == "DequantizeLinear"
    feeds = [{"x": rng.normal(size=(4, 8)).astype(np.float32)}]
    onnx.save(quantized, str(tmp_path / "m2_float.onnx"))
    got = run_model(tmp_path / "m2_float.onnx", feeds, qdq_as_written=True)[0]["y"]
    x, w1, w2 = feeds[0]["x"], *(numpy_helper.to_array(w) for w in weights)
    np.testing.assert_allclose(got - x @ w2, x @ w1, rtol=0.1, atol=0.1)  # m1 in INT8: near its float product
    assert not np.allclose(got - x @ w2, x @ w1, rtol=1e-6, atol=1e-6)  # and not exactly it


def test_nothing_left_to_quantize_is_an_error_not_a_float_artifact(tiny_tf: Path, tmp_path: Path) -> None:
    import onnx

    from edgedeploy.errors import StageError

    nodes = transformer.weight_matmuls(onnx.load(str(tiny_tf)))
    with pytest.raises(StageError, match="kept all 5 weight MatMuls in float"):
        transformer.quantize_transformer(
            tiny_tf,
            tmp_path / "int8.onnx",
            tmp_path,
            scheme=transformer.scheme_for("onnxruntime"),
            batches=_batches(4, seed=8),
            keep_fp32=nodes,
        )
    assert not (tmp_path / "int8.onnx").exists()
    cnn = tmp_path / "cnn.onnx"
    onnx.save(onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
    ), opset_imports=[onnx.helper.make_opsetid("", 17)]), str(cnn))  # fmt: skip
    with pytest.raises(StageError, match="no MatMul or Gemm with a constant 2-D weight"):
        transformer.quantize_transformer(
            cnn, tmp_path / "x.onnx", tmp_path, scheme=transformer.scheme_for("onnxruntime"), batches=[{}]
        )


def test_transformer_judges_the_held_out_batches_the_goldens_carry(
    tiny_tf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgedeploy.precision import analysis
    from edgedeploy.precision.data import split_heldout

    batches = _batches(16, seed=3)
    calls: list[tuple[str, list[int]]] = []
    real, real_runner = analysis.run_model, analysis.batch_runner
    monkeypatch.setattr(
        analysis,
        "run_model",
        lambda path, b, **kw: calls.append((str(path), [id(x) for x in b])) or real(path, b, **kw),
    )

    def spied_runner(path, **kw):  # type: ignore[no-untyped-def]
        run = real_runner(path, **kw)
        return lambda b: calls.append(("judged " + str(path), [id(x) for x in b])) or run(b)

    monkeypatch.setattr(analysis, "batch_runner", spied_runner)
    _, plan, _ = transformer.quantize_transformer(
        tiny_tf, tmp_path / "q.onnx", tmp_path, scheme=transformer.scheme_for("onnxruntime"), batches=batches
    )
    _, held = split_heldout(batches)  # what the reference stage puts into the goldens: the last quarter
    assert [id(b) for b in held] == [id(b) for b in batches[-4:]] and plan["held_out"]["batches"] == 4
    held_ids = [id(b) for b in held]
    judged = [(what, ids) for what, ids in calls if set(ids) & set(held_ids)]
    # the float reference ran on exactly those batches, each candidate on them in order, a step at a time (it stops
    # once the target is out of reach); nothing mixed them with calibration batches
    assert [ids for what, ids in judged if not what.startswith("judged")] == [held_ids]
    steps = [ids for what, ids in judged if what.startswith("judged")]
    assert steps and all(ids == held_ids[held_ids.index(ids[0]) :][: len(ids)] for ids in steps)
    assert {i for ids in steps for i in ids} == set(held_ids)


def test_smoothquant_alpha_is_validated(tiny_project: Path) -> None:
    with pytest.raises(ConfigError, match="precision.smoothquant_alpha"):
        edgedeploy.load_config(tiny_project, precision__smoothquant_alpha=1.5)
    with pytest.raises(ConfigError, match="int8_recipe"):
        edgedeploy.load_config(tiny_project, precision__int8_recipe="vit")


def _tiny_project(tmp_path: Path, target: str) -> Path:
    """A deploy.toml for the tiny transformer (real safetensors checkpoint, padded calibration .npz)."""
    import torch
    from safetensors.torch import save_file

    proj = tmp_path / "proj"
    proj.mkdir()
    mod = f"tiny_tf_{uuid.uuid4().hex[:8]}"
    (proj / f"{mod}.py").write_text(TINY_TF)
    ns: dict = {}
    exec(compile(TINY_TF, "tiny_tf.py", "exec"), ns)  # the test's own model source
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in ns["build"]().state_dict().items()}, str(proj / "w.safetensors"))
    batches = _batches(12, seed=6)
    np.savez(proj / "calib.npz", **{k: np.concatenate([b[k] for b in batches]) for k in batches[0]})
    (proj / "deploy.toml").write_text(
        textwrap.dedent(
            f"""
            outputs = ["logits"]
            [model]
            factory = "{mod}:build"
            checkpoint = "w.safetensors"
            [[inputs]]
            name = "input_ids"
            shape = ["batch", 12]
            dtype = "int64"
            range = [0, 49]
            [[inputs]]
            name = "attention_mask"
            shape = ["batch", 12]
            dtype = "int64"
            range = [1, 1]
            [dims.batch]
            min = 1
            opt = 2
            max = 2
            [precision]
            mode = "int8"
            calib = "calib.npz"
            calib_samples = 24
            [validate]
            samples = 1
            latency_iters = 2
            latency_warmup = 1
            [build]
            target = "{target}"
            out = "out"
            """
        )
    )
    return proj / "deploy.toml"


@pytest.mark.slow  # ~22 s; test_hf's INT8 BERT build from a sentences file keeps this path in the fast run
def test_cpu_int8_build_of_a_transformer(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """deploy build --precision int8 on the tiny transformer: the transformer recipe, notes and validation; the
    goldens veto takes the held-out goldens' outputs from the judge (each candidate runs them once)."""
    from edgedeploy.precision import goldens_veto as gv

    taken: list[tuple[set[int], set[int]]] = []
    veto = gv.goldens_veto

    def recording(cfg, model, cases, known=None, **kwargs):  # type: ignore[no-untyped-def]
        taken.append(({i for i, c in enumerate(cases) if c[0] == "calib-heldout"}, set(known or {})))
        return veto(cfg, model, cases, known, **kwargs)

    monkeypatch.setattr(gv, "goldens_veto", recording)
    result = edgedeploy.build(_tiny_project(tmp_path, "cpu"), log=lambda _: None)
    assert result.ok
    assert taken and all(held and held <= known for held, known in taken), taken
    plan = json.loads((result.out / "precision.json").read_text())
    assert plan["strategy"] == "transformer-dynamic-matmul"
    assert plan["int8_recipe"]["chosen"] == "transformer" and plan["quantized_matmuls"] == 5
    assert plan["held_out"]["disjoint"] and plan["accuracy"]["score"] >= 0.99
    assert plan["absurd_ranges"] and plan["kept_float"] == []
    assert not [w for w in result.report["warnings"] if "INT8" in w or "calibration" in w]
    cand = {c["name"]: c for c in result.report["parity"]["candidates"]}["onnxruntime-int8"]
    assert cand["status"] == "passed"


@pytest.mark.slow
def test_a_transformer_build_out_of_time_fails_naming_the_time_budget(tmp_path: Path) -> None:
    from edgedeploy.errors import StageError

    cfg = _tiny_project(tmp_path, "cpu")
    with pytest.raises(StageError) as err:
        edgedeploy.build(cfg, log=lambda _: None, precision__accuracy_target=1.0, precision__time_budget_s=0.001)
    line = err.value.one_line()
    assert "after 0 fallback tries" in line and "stopped: precision.time_budget_s spent before any try" in line
    assert "raise precision.time_budget_s (now 0.001)" in line and "max_fallback_tries" not in line
    out = tmp_path / "proj" / "out"
    assert [p.name for p in out.iterdir()] == [".last-failed"]  # no partial artifact; the failed run's files aside


@pytest.mark.slow
def test_jetson_orin_int8_bundle_of_a_transformer_passes_its_dry_run(tmp_path: Path) -> None:
    import subprocess
    import sys

    result = edgedeploy.build(_tiny_project(tmp_path, "jetson-orin"), log=lambda _: None)
    assert result.report["status"] == "passed" and not result.ok  # passed here; validated on the device
    plan = json.loads((result.out / "precision.json").read_text())
    assert plan["strategy"] == "transformer-qdq-matmul" and plan["scheme"]["activations"] == "calibrated"
    assert not (result.out / "calib.cache").exists()  # TensorRT 10.3: explicit Q/DQ only
    bundle = result.out / "bundle"
    assert json.loads((bundle / "plan.json").read_text())["strategy"] == "int8-qdq"
    run = subprocess.run(
        [sys.executable, "complete_bundle.py", ".", "--runner", "onnxruntime"],
        cwd=bundle,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and "PASSED" in run.stdout + run.stderr, run.stdout + run.stderr


def test_a_transformer_candidate_the_goldens_check_would_fail_is_vetoed(tiny_tf: Path, tmp_path: Path) -> None:
    """The veto gets each candidate with the held-out batches it was judged on and its outputs on them, as
    judged (the goldens' held-out samples are among them: not run again)."""
    from edgedeploy.precision.analysis import run_model

    asked: list[str] = []

    def veto(model: Path, judged, outputs) -> str | None:  # type: ignore[no-untyped-def]
        asked.append(model.name)
        assert len(judged) == len(outputs) == 2  # the last quarter of 8 batches
        for mine, theirs in zip(run_model(model, judged), outputs):
            np.testing.assert_array_equal(mine["logits"], theirs["logits"])
        return "golden real sample calib-heldout#0 logits fails tolerance.int8: cosine 0.9998 < 0.99999"

    result, _, _ = transformer.quantize_transformer(
        tiny_tf, tmp_path / "int8.onnx", tmp_path, scheme=transformer.scheme_for("onnxruntime"),
        batches=_batches(8, seed=7), accuracy_target=0.5, max_tries=1, veto=veto,
    )  # fmt: skip
    # every try met the score and was vetoed: the search went on, and nothing met the target
    assert not result.met and [t["met"] for t in result.tries] == [False, False]
    assert all(t["vetoed"].startswith("golden real sample") for t in result.tries) and len(asked) == 2


@pytest.mark.slow
def test_a_transformer_build_the_bundles_dry_run_would_fail_fails_at_the_precision_stage(tmp_path: Path) -> None:
    from edgedeploy.errors import StageError

    cfg = _tiny_project(tmp_path, "jetson-orin")
    with pytest.raises(StageError, match=r"fails tolerance.int8"):
        edgedeploy.build(cfg, log=lambda _: None, tolerance__int8__min_cosine=0.9999999)
