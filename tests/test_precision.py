"""Precision analysis and conversion on real photos: FP16 overflow pins, INT8 sensitivity fallback, QDQ flavours,
and the precision stage on TensorRT targets (builder-flag FP16, typed FP16 ONNX, implicit-INT8 cache)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_calib_cache import export_onnx
from test_calib_data import make_cfg, photo_folder

from edgedeploy.precision import analysis
from edgedeploy.precision.fallback import quantize_with_fallback
from edgedeploy.precision.fp16 import mixed_fp16
from edgedeploy.precision.quantize import QDQ_FLAVOURS, Quantizer, flavour_for, preprocess


def photo_batches(samples: int = 32, batch: int = 8, size: int = 16) -> list[dict[str, np.ndarray]]:
    """Crops of real photos (skimage.data) as NCHW float32 in [-1, 1]."""
    import skimage.data

    photos = [skimage.data.astronaut(), skimage.data.chelsea(), skimage.data.coffee()]
    rng = np.random.default_rng(0)
    crops = []
    for i in range(samples):
        img = photos[i % len(photos)]
        y, x = int(rng.integers(0, img.shape[0] - size)), int(rng.integers(0, img.shape[1] - size))
        crops.append(img[y : y + size, x : x + size].transpose(2, 0, 1) / 127.5 - 1.0)
    arr = np.stack(crops).astype(np.float32)
    return [{"image": arr[i : i + batch]} for i in range(0, samples, batch)]


def overflow_net():
    """A CNN whose first conv's activations reach ~1e5 (> FP16 max) before a Mul scales them back."""
    import torch
    from torch import nn

    class OverflowNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(3, 4, 3, padding=1)
            self.c2 = nn.Conv2d(4, 4, 3, padding=1)
            self.fc = nn.Linear(4, 5)
            with torch.no_grad():
                self.c1.weight.mul_(1e5)
                self.c1.bias.mul_(1e5)

        def forward(self, image):
            y = torch.relu(self.c1(image) * 1e-5)
            return self.fc(torch.relu(self.c2(y)).mean((2, 3)))

    torch.manual_seed(0)
    return OverflowNet()


def outlier_net():
    """A CNN with one activation channel 1000x larger than the rest: per-tensor INT8 wipes the small channels."""
    import torch
    from torch import nn

    class OutlierNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(3, 4, 3, padding=1)
            self.c2 = nn.Conv2d(4, 8, 3, padding=1)
            self.fc = nn.Linear(8, 10)
            self.register_buffer("gain", torch.tensor([1000.0, 1.0, 1.0, 1.0]).view(1, 4, 1, 1))
            with torch.no_grad():
                self.c2.weight[:, 0] *= 1e-3

        def forward(self, image):
            y = torch.relu(self.c1(image)) * self.gain
            return self.fc(torch.relu(self.c2(y)).mean((2, 3)))

    torch.manual_seed(0)
    return OutlierNet()


def test_fp16_overflow_is_flagged_and_pinned(tmp_path: Path) -> None:
    import onnx

    batches = photo_batches()
    path = export_onnx(overflow_net(), batches[0]["image"], tmp_path / "overflow.onnx")
    stats = analysis.tensor_ranges(path, batches, tmp_path)
    findings = analysis.fp16_findings(stats, onnx.load(str(path)))
    overflow = [f for f in findings if f["issue"] == "overflow"]
    assert [f["tensor"] for f in overflow] == ["/c1/Conv_output_0"]
    assert overflow[0]["absmax"] > analysis.FP16_MAX
    with np.errstate(over="ignore"):
        assert np.isinf(np.float16(overflow[0]["absmax"]))  # what FP16 storage would make of it
    pins = analysis.fp16_pins(findings)
    assert set(pins) == {"/c1/Conv", "/Mul"} and "FP16 overflow" in pins["/c1/Conv"]

    # simulated FP16 (weights and layer outputs rounded to FP16): without the pins the output is Inf
    unpinned = mixed_fp16(path, tmp_path / "unpinned.onnx", simulate=True)
    assert unpinned["fp32_nodes"] == []
    assert not np.isfinite(analysis.run_model(tmp_path / "unpinned.onnx", batches)[0]["logits"]).all()
    info = mixed_fp16(path, tmp_path / "fp16.onnx", keep_fp32=list(pins))
    assert set(info["fp32_nodes"]) == {"/c1/Conv", "/Mul"} and info["casts"] >= 2
    fp16 = onnx.load(str(tmp_path / "fp16.onnx"))
    onnx.checker.check_model(fp16, full_check=True)
    inits = {i.name: i.data_type for i in fp16.graph.initializer}
    nodes = {n.name: n for n in fp16.graph.node}
    assert inits[nodes["/c1/Conv"].input[1]] == onnx.TensorProto.FLOAT  # pinned: FP32 weights
    assert inits[nodes["/c2/Conv"].input[1]] == onnx.TensorProto.FLOAT16  # the rest is FP16
    assert fp16.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # io kept FP32
    ref = analysis.run_model(path, batches)
    got = analysis.run_model(tmp_path / "fp16.onnx", batches)
    assert analysis.accuracy(ref, got, [])["score"] > 0.999


def test_int8_fallback_finds_the_outlier_layers(tmp_path: Path) -> None:
    batches = photo_batches(32, 8)
    path = export_onnx(outlier_net(), batches[0]["image"], tmp_path / "outlier.onnx")
    q = Quantizer(preprocess(path, tmp_path / "float.onnx"), tmp_path, flavour_for("onnxruntime"))
    result = quantize_with_fallback(
        q,
        out=tmp_path / "model.int8.onnx",
        batches=batches,
        classifier_outputs=[],
        accuracy_target=0.99,
        max_tries=4,
        latency_feeds=batches[0],
        latency_iters=3,
    )
    naive, final = result.tries[0], result.final
    assert naive["metric"] == "cosine" and naive["score"] < 0.99  # naive INT8 misses the target
    assert result.met and final["score"] >= 0.99
    assert set(result.excluded) == {"/Mul", "/c2/Conv"}  # the outlier tensor's producer and consumer
    assert all("INT8 sensitive" in why for why in result.excluded.values())
    assert {r["node"] for r in result.sensitivity[:2]} == {"/Mul", "/c2/Conv"}  # ranked most sensitive
    assert result.sensitivity[1]["output_error"] > 3 * result.sensitivity[2]["output_error"]
    # the two outliers hold the ranking's error: the search starts at 2 sensitive nodes, and 1 fails after it
    assert [(t.get("family"), t["float_nodes"], t["met"]) for t in result.tries] == [
        (None, 0, False),
        ("sensitivity", 2, True),
        ("sensitivity", 1, False),
    ]
    assert result.final["family"] == "sensitivity" and result.final["float_nodes"] == 2
    assert {"fp32", "int8_naive", "int8_final", "fallback_cost"} <= set(result.latency)
    ref = analysis.run_model(q.float_model, batches)
    assert analysis.accuracy(ref, analysis.run_model(tmp_path / "model.int8.onnx", batches), [])["score"] >= 0.99


def test_fallback_gives_up_after_max_tries(tmp_path: Path) -> None:
    batches = photo_batches(16, 8)
    path = export_onnx(outlier_net(), batches[0]["image"], tmp_path / "outlier.onnx")
    q = Quantizer(preprocess(path, tmp_path / "float.onnx"), tmp_path, flavour_for("onnxruntime"))
    result = quantize_with_fallback(
        q, out=tmp_path / "m.onnx", batches=batches, classifier_outputs=[], accuracy_target=0.999999, max_tries=1
    )
    # the one try (the ranking's 2 outliers float) misses this target: the largest failing set is reported
    assert not result.met and len(result.tries) == 2 and len(result.excluded) == result.tries[1]["float_nodes"] == 2
    assert result.stop == "precision.max_fallback_tries = 1 spent"


@pytest.mark.parametrize("runtime", ["tensorrt", "onnxruntime"])
def test_qdq_flavour_per_runtime(tmp_path: Path, runtime: str) -> None:
    import onnx
    from onnx import numpy_helper

    batches = photo_batches(16, 8)
    path = export_onnx(overflow_net(), batches[0]["image"], tmp_path / "m.onnx")
    flavour = QDQ_FLAVOURS[runtime]
    out = Quantizer(path, tmp_path, flavour).quantize(tmp_path / "q.onnx", batches)
    model = onnx.load(str(out))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    act_zps = [inits[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits]
    assert act_zps
    dq_inputs = [
        inits[n.input[0]].dtype for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
    ]
    weights = [
        inits[n.input[0]]
        for n in model.graph.node
        if n.op_type == "DequantizeLinear" and inits.get(n.input[0], np.zeros(0, np.float32)).dtype == np.int8
    ]
    assert weights
    if runtime == "tensorrt":
        assert flavour.name == "S8S8"
        assert all(z.dtype == np.int8 and not z.any() for z in act_zps)  # symmetric signed: zero point 0
        assert np.int32 not in dq_inputs  # TensorRT takes float biases only
        assert max(int(np.abs(w).max()) for w in weights) == 127  # full 8-bit weights
    else:
        assert flavour.name == "U8S8" and all(z.dtype == np.uint8 for z in act_zps)
        assert np.int32 in dq_inputs  # int32 biases for ONNX Runtime's integer kernels
        assert max(int(np.abs(w).max()) for w in weights) == 127  # 8-bit weights unless reduce_range says 7
        q7 = Quantizer(path, tmp_path, flavour, reduce_range=True).quantize(tmp_path / "q7.onnx", batches)
        inits7 = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(q7)).graph.initializer}
        assert max(int(np.abs(w).max()) for w in inits7.values() if w.dtype == np.int8) <= 64  # 7-bit weights


def test_reduce_range_follows_the_cpu_and_the_config() -> None:
    from edgedeploy.precision.quantize import cpu_int8_flags, reduce_range_choices

    vnni = "processor: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni amx_int8 amx_tile\n"
    assert cpu_int8_flags(vnni) == ("avx512_vnni", "amx_int8")
    assert cpu_int8_flags("flags : fpu sse2 avx2 fma\n") == ()
    assert reduce_range_choices("auto", "onnxruntime", ("avx512_vnni",))[0] == [False]  # 8-bit on VNNI
    choices, why = reduce_range_choices("auto", "onnxruntime", ())
    assert choices == [False, True] and "measured" in why  # no VNNI: both measured, the better kept
    assert reduce_range_choices("auto", "tensorrt", ())[0] == [False]
    assert reduce_range_choices(True, "onnxruntime", ("avx512_vnni",))[0] == [True]  # explicit wins


def test_calibration_methods_give_different_ranges(tmp_path: Path) -> None:
    """minmax, percentile, entropy and mse pick different ranges for a heavy-tailed activation, and different
    QDQ models (onnxruntime's own Entropy calibrator returns the min/max model byte for byte here)."""
    import onnx
    from onnx import numpy_helper

    from edgedeploy.precision import histogram

    batches = photo_batches(32, 8)
    path = export_onnx(outlier_net(), batches[0]["image"], tmp_path / "m.onnx")
    hists = histogram.collect(path, batches, tmp_path)
    assert "image" in hists  # the graph input is calibrated too
    ranges = {m: histogram.choose_ranges(hists, m) for m in ("minmax", "percentile", "entropy", "mse")}
    tensor = "/Mul_output_0"  # one channel 1000x the others: a long tail
    lo, hi = ranges["minmax"][tensor]
    assert (lo, hi) == (min(hists[tensor].lo, 0.0), hists[tensor].hi)
    assert ranges["percentile"][tensor][1] < hi and ranges["entropy"][tensor][1] < hi
    assert ranges["percentile"][tensor] != ranges["entropy"][tensor]
    assert ranges["mse"][tensor][1] < hi and ranges["mse"][tensor] not in (
        ranges["percentile"][tensor],
        ranges["entropy"][tensor],
    )
    exact = histogram.choose_ranges(hists, "entropy", exact=["logits"])  # outputs are never clipped
    assert exact["logits"] == ranges["minmax"]["logits"] and exact[tensor] == ranges["entropy"][tensor]
    scales = {}
    for m in ranges:
        work = tmp_path / m
        work.mkdir()
        q = Quantizer(path, work, flavour_for("onnxruntime"), method=m).quantize(work / "q.onnx", batches)
        model = onnx.load(str(q))
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        scales[m] = {n.input[0]: float(inits[n.input[1]]) for n in model.graph.node if n.op_type == "QuantizeLinear"}
    assert len({scales[m][tensor] for m in scales}) == 4


def _stage_ctx(tmp_path: Path, target: str, mode: str, model, precision: dict | None = None):
    from edgedeploy.stages.base import BuildContext
    from edgedeploy.targets import get_target

    batches = photo_batches(8, 4)
    staging = tmp_path / "staging"
    staging.mkdir()
    export_onnx(model, batches[0]["image"], staging / "model.onnx")
    folder = photo_folder(tmp_path / "calib", count=8, size=32)
    cfg = make_cfg(
        tmp_path,
        precision={"mode": mode, "calib": str(folder), "calib_samples": 8, **(precision or {})},
        normalization={"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
    )
    return BuildContext(cfg=cfg, target=get_target(target), staging=staging, out=tmp_path / "out")


def test_stage_fp16_builder_flag_for_trt10(tmp_path: Path) -> None:

    from edgedeploy.stages.precision import PrecisionFromOnnx

    ctx = _stage_ctx(tmp_path, "jetson-orin", "fp16", overflow_net())
    stage = PrecisionFromOnnx()
    # no FP16 graph to build from: FP32 graph + flag + pins, and the FP16 simulation the bundle's dry run runs
    assert set(stage.outputs(ctx)) == {"precision.json", "model.fp16-simulated.onnx"}
    result = stage.run(ctx)
    metrics = result.metrics
    plan = json.loads((ctx.staging / "precision.json").read_text())
    assert plan["strategy"] == "builder-flag" and plan["onnx_dtype"] == "float32" and plan["onnx"] == "model.onnx"
    assert {p["node"] for p in plan["fp32_layers"]} == {"/c1/Conv", "/Mul"}
    assert all(p["pin_output_type"] for p in plan["fp32_layers"])
    assert not (ctx.staging / "model.fp16.onnx").exists()
    assert plan["host_check"]["score"] > 0.999 and plan["library_warnings"] == []
    assert metrics["calibration"]["kind"] == "images" and len(metrics["calibration"]["source_sha256"]) == 64
    assert any("pinned to FP32" in w for w in result.warnings) and not ctx.warnings  # in the result only
    assert not [p for p in ctx.staging.iterdir() if p.name.startswith("precision-")]  # temp folder cleaned


def test_stage_fp16_typed_onnx_for_trt11(tmp_path: Path) -> None:
    import onnx

    from edgedeploy.stages.precision import PrecisionFromOnnx

    ctx = _stage_ctx(tmp_path, "desktop-trt11", "fp16", overflow_net())
    PrecisionFromOnnx().run(ctx)
    plan = json.loads((ctx.staging / "precision.json").read_text())
    assert plan["strategy"] == "typed-onnx" and plan["onnx_dtype"] == "float16"
    fp16 = onnx.load(str(ctx.staging / "model.fp16.onnx"))
    onnx.checker.check_model(fp16, full_check=True)
    types = {i.data_type for i in fp16.graph.initializer}
    assert onnx.TensorProto.FLOAT16 in types and onnx.TensorProto.FLOAT in types  # pinned nodes stay FP32
    assert plan["host_check"]["score"] > 0.999
    got = analysis.run_model(ctx.staging / "model.fp16.onnx", photo_batches(8, 4))  # loads and runs in ORT
    assert np.isfinite(got[0]["logits"]).all()


def test_stage_fp16_names_the_layer_to_pin_when_fp16_still_overflows(tmp_path: Path) -> None:
    """FP16 trouble the FP32 range analysis cannot see: a tiny divisor flushes to 0 in FP16, so the pinned
    division gives Inf. The simulated host check catches it and the hint names the layer that makes the divisor."""
    import torch
    from torch import nn

    from edgedeploy.errors import StageError
    from edgedeploy.stages.precision import PrecisionFromOnnx

    class TinyDivisor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, image):
            small = torch.sigmoid(self.conv(image)) * 1e-9  # ~1e-9: FP16 flushes it to 0
            return (image.mean((1, 2, 3)).unsqueeze(1) / small.mean((2, 3))) * 1e-9

    torch.manual_seed(0)
    ctx = _stage_ctx(tmp_path, "jetson-orin", "fp16", TinyDivisor())
    with pytest.raises(StageError) as err:
        PrecisionFromOnnx().run(ctx)
    assert "NaN/Inf" in str(err.value)
    assert "/ReduceMean_1" in (err.value.hint or "") and "precision.keep_fp32" in err.value.hint  # the divisor


def test_stage_int8_trt_writes_calibration_cache(tmp_path: Path) -> None:
    from edgedeploy.precision.calib_cache import read_trt_cache
    from edgedeploy.stages.precision import PrecisionFromOnnx

    ctx = _stage_ctx(tmp_path, "jetson-xavier", "int8", overflow_net(), {"accuracy_target": 0.9})
    stage = PrecisionFromOnnx()
    assert "calib.cache" in stage.outputs(ctx)
    result = stage.run(ctx)
    metrics = result.metrics
    assert metrics["qdq_flavour"]["name"] == "S8S8"
    cache = read_trt_cache(ctx.staging / "calib.cache")
    assert cache.header == "TRT-8500-EntropyCalibration2" == metrics["implicit_int8"]["header"]
    assert "image" in cache.scales and cache.amax()["image"] == pytest.approx(1.0, abs=0.01)
    assert (ctx.staging / "model.int8.onnx").is_file()
    shutil.rmtree(ctx.staging)


def test_stage_int8_trt_mse_ranges_reach_the_calibration_cache(tmp_path: Path) -> None:
    """calib_method = "mse" on a TensorRT target: the symmetric least-error ranges are what the Q/DQ model and
    TensorRT's calibration cache carry (never wider than min/max, some narrower)."""
    from edgedeploy.precision.calib_cache import read_trt_cache
    from edgedeploy.stages.precision import PrecisionFromOnnx

    amax = {}
    for method in ("minmax", "mse", "auto"):
        (tmp_path / method).mkdir()
        ctx = _stage_ctx(tmp_path / method, "jetson-xavier", "int8", outlier_net(), {"calib_method": method})
        result = PrecisionFromOnnx().run(ctx)
        chosen = result.metrics["calib_method"]
        assert chosen == ({"name": method, "why": "precision.calib_method"} if method != "auto" else chosen)
        amax[method] = read_trt_cache(ctx.staging / "calib.cache").amax()
    # auto on a model whose output is not a classifier output: min/max ranges, nothing clipped
    assert chosen["name"] == "minmax" and "not every output is a classifier output" in chosen["why"]
    assert amax["auto"] == amax["minmax"]
    shared = amax["minmax"].keys() & amax["mse"].keys()
    assert all(amax["mse"][t] <= amax["minmax"][t] * (1 + 1e-6) for t in shared)
    assert amax["mse"]["logits"] == amax["minmax"]["logits"]  # graph outputs keep min/max
    assert any(amax["mse"][t] < 0.99 * amax["minmax"][t] for t in shared)  # some tail was clipped


def test_calib_method_auto_is_mse_for_classifiers_only() -> None:
    from edgedeploy.precision.quantize import calib_method_for

    assert calib_method_for("auto", ["logits"], ["logits"])[0] == "mse"
    assert calib_method_for("auto", ["logits", "embedding"], ["logits"])[0] == "minmax"
    assert calib_method_for("auto", ["embedding"], [])[0] == "minmax"
    assert calib_method_for("entropy", ["logits"], ["logits"]) == ("entropy", "precision.calib_method")


def test_fp16_underflow_is_flagged_not_pinned(tmp_path: Path) -> None:
    import onnx
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, image):
            return (self.conv(image) * 1e-9).mean((2, 3))  # values ~1e-9: below FP16's smallest subnormal

    torch.manual_seed(0)
    batches = photo_batches(8, 4)
    path = export_onnx(Tiny(), batches[0]["image"], tmp_path / "tiny.onnx")
    findings = analysis.fp16_findings(analysis.tensor_ranges(path, batches, tmp_path), onnx.load(str(path)))
    under = [f for f in findings if f["issue"] == "underflow"]
    assert "/Mul_output_0" in {f["tensor"] for f in under}
    assert all(f["issue"] != "overflow" for f in findings)
    assert analysis.fp16_pins(findings) == {}


def test_a_layer_kept_in_float_stays_float_when_onnxruntime_loads_it(tmp_path: Path) -> None:
    """onnxruntime's WeightBiasQuantization transformer quantizes the float weights of a Conv whose input comes
    from a DequantizeLinear: a layer the fallback kept in float would be re-quantized at load time. The
    quantizer feeds such layers the float tensor (re-inserting a Relu folded into the Q range)."""
    import onnx
    import onnxruntime as ort

    batches = photo_batches(16, 8)
    path = export_onnx(overflow_net(), batches[0]["image"], tmp_path / "m.onnx")
    q = Quantizer(preprocess(path, tmp_path / "float.onnx"), tmp_path, flavour_for("onnxruntime"))
    out = q.quantize(tmp_path / "q.onnx", batches, exclude=["/c2/Conv"])
    model = onnx.load(str(out))
    producers = {o: n for n in model.graph.node for o in n.output}
    conv2 = next(n for n in model.graph.node if n.name == "/c2/Conv")
    assert producers[conv2.input[0]].op_type == "Relu"  # the folded Relu restored for the float reader
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    ort.InferenceSession(str(out), opts, providers=["CPUExecutionProvider"])
    loaded = onnx.load(str(tmp_path / "loaded.onnx"))
    producers = {o: n for n in loaded.graph.node for o in n.output}
    conv2 = next(n for n in loaded.graph.node if n.name == "/c2/Conv")
    assert all(producers.get(i) is None or producers[i].op_type != "DequantizeLinear" for i in conv2.input[1:])
    ref = analysis.run_model(q.float_model, batches)
    assert analysis.accuracy(ref, analysis.run_model(out, batches), [])["score"] > 0.99


def test_int8_that_needs_every_layer_in_float_is_refused_not_shipped_as_int8(tmp_path: Path) -> None:
    from edgedeploy.errors import StageError
    from edgedeploy.stages.precision import PrecisionFromOnnx

    # nearest rounding: with AdaRound the stem conv alone in INT8 reaches cosine 0.99999997 and the build passes
    over = {"accuracy_target": 0.9999999, "max_fallback_tries": 12, "weight_rounding": "nearest"}
    ctx = _stage_ctx(tmp_path, "cpu", "int8", outlier_net(), over)
    with pytest.raises(StageError) as err:
        PrecisionFromOnnx().run(ctx)
    assert "leaves no INT8 compute" in str(err.value) and "FP32 model" in str(err.value)
    assert "lower precision.accuracy_target" in (err.value.hint or "")


def test_a_target_the_held_out_set_cannot_resolve_says_so() -> None:
    from edgedeploy.precision.heldout import resolution_hint

    hint = resolution_hint("top1_agreement", 16, 0.99)  # one flip in 16 is 6.25 %: 0.99 means "no flip"
    assert "judged on 16 held-out samples" in hint and "6.2%" in hint and "precision.calib_samples" in hint
    assert resolution_hint("top1_agreement", 200, 0.99) == ""  # 1 flip in 200 still meets 0.99
    assert resolution_hint("cosine", 16, 0.99) == ""  # a continuous score has no such steps


def test_default_target_is_the_gates_top1_agreement_for_classifiers_and_cosine_otherwise() -> None:
    from edgedeploy.precision.heldout import accuracy_target_for

    target, why = accuracy_target_for(None, ["logits"], ["logits"], 0.95)
    assert target == 0.95 and "min_topk_agreement" in why
    assert accuracy_target_for(None, ["logits"], ["logits"], 0.9)[0] == 0.9  # follows tolerance.int8
    assert accuracy_target_for(None, ["logits"], ["logits"], None)[0] == 0.95  # no top-1 tolerance: gate default
    assert accuracy_target_for(None, ["embedding"], [], 0.95)[0] == 0.99  # cosine
    assert accuracy_target_for(None, ["logits", "boxes"], ["logits"], 0.95)[0] == 0.99  # the stricter one
    assert accuracy_target_for(0.97, ["logits"], ["logits"], 0.95) == (0.97, "precision.accuracy_target")


def test_the_precision_judge_sees_more_views_than_the_goldens_and_starts_with_theirs() -> None:
    import skimage.data

    from edgedeploy.precision.data import split_for_judging
    from edgedeploy.precision.heldout import JUDGE_VIEWS, heldout_views

    pic = skimage.data.coffee()  # a real photo, (400, 600, 3) uint8
    rows = [np.ascontiguousarray(pic[y : y + 40, 100:148].transpose(2, 0, 1)[None]) for y in range(0, 320, 40)]
    batches = [{"image": r.astype(np.float32) / 255.0} for r in rows]  # 8 samples: 6 calibrate, 2 held out
    calib, goldens = split_for_judging(batches, "images", "NCHW")
    calib_wide, judged = split_for_judging(batches, "images", "NCHW", wide=True)
    assert len(calib) == len(calib_wide) == 6 and len(goldens) == 12 and len(judged) == 2 * JUDGE_VIEWS == 64
    per_photo = [judged[:JUDGE_VIEWS], judged[JUDGE_VIEWS:]]
    assert all(np.array_equal(a["image"], b["image"]) for a, b in zip(goldens, per_photo[0][:6] + per_photo[1][:6]))
    views = [v["image"] for v in per_photo[0]]
    assert all(v.shape == rows[0].shape for v in views)
    assert all(not np.allclose(a, b, atol=1e-3) for i, a in enumerate(views) for b in views[i + 1 :])  # all differ
    # the last views mirror the crops: view 17 + k is the mirror image of view 2 + k
    assert all(np.allclose(views[17 + k], views[2 + k][..., ::-1]) for k in range(15))
    # a horizontal ramp shows the crop sizes: the 0.5 crops span half the columns, the 0.8 ones 80 %
    ramp = np.broadcast_to(np.arange(64, dtype=np.float32), (1, 1, 48, 64)).copy()
    spans = [float(v["image"].max() - v["image"].min()) for v in heldout_views([{"image": ramp}], "NCHW", 99, 17)]
    assert spans[0] == 63 and all(abs(s - 63 * 0.8) < 2.5 for s in spans[2:7]) and abs(spans[-1] - 31.5) < 2.5
    assert len(heldout_views(batches, "NCHW", max_samples=100, max_views=32)) == 96  # 12 per photo fit in 100


def test_expected_top1_agreement_counts_each_sample_by_its_lead_and_the_measured_spread() -> None:
    from edgedeploy.precision.heldout import expected_top1_agreement, held_out_score

    rng = np.random.default_rng(0)
    ref = rng.normal(size=(400, 50)) * 3
    assert expected_top1_agreement(ref, ref) == 1.0
    noisy = [ref + rng.normal(scale=s, size=ref.shape) for s in (0.05, 0.2, 0.6)]
    estimates = [expected_top1_agreement(ref, c) for c in noisy]
    assert 1.0 > estimates[0] > estimates[1] > estimates[2] > 0.5
    observed = [float(np.mean(ref.argmax(1) == c.argmax(1))) for c in noisy]
    assert all(abs(e - o) < 0.03 for e, o in zip(estimates, observed))  # small perturbations: close to the count
    # one flip among 20 samples costs 5 % of the count; the estimate weighs every sample's lead instead
    small = ref[:20]
    cand = small.copy()
    second, top = np.argsort(small[0])[-2:]
    cand[0, [top, second]] = small[0, [second, top]]  # sample 0 swaps its top two classes, the rest are exact
    score = held_out_score([{"logits": small}], [{"logits": cand}], ["logits"])["outputs"]["logits"]
    assert score["observed"] == 0.95 and score["value"] == min(score["observed"], score["expected"])
    assert 0.5 < score["expected"] < 1.0  # the flip's size sets the spread: every sample's lead is weighed by it


def test_a_grouped_top1_score_is_lowered_by_the_groups_standard_error() -> None:
    from edgedeploy.precision import analysis

    rng = np.random.default_rng(1)
    ref = [{"logits": rng.normal(size=(32, 30)) * 3} for _ in range(6)]  # 3 photos x 2 views x 32 samples

    def noisy(scales: tuple[float, ...]) -> list[dict[str, np.ndarray]]:
        return [{"logits": r["logits"] + rng.normal(scale=s, size=(32, 30))} for r, s in zip(ref, scales)]

    one_photo = noisy((0.0, 0.0, 0.0, 0.0, 1.0, 1.0))  # photos 1 and 2 exact, photo 3 noisy
    plain = analysis.accuracy(ref, one_photo, ["logits"])["outputs"]["logits"]
    grouped = analysis.accuracy(ref, one_photo, ["logits"], groups=[2, 2, 2])["outputs"]["logits"]
    assert "standard_error" not in plain and grouped["standard_error"] > 0.01
    assert grouped["value"] == pytest.approx(plain["value"] - grouped["standard_error"])
    # changes spread over every photo: the photos agree with each other, so the error bar is far smaller
    spread_out = noisy((0.58,) * 6)
    even = analysis.accuracy(ref, spread_out, ["logits"], groups=[2, 2, 2])["outputs"]["logits"]
    assert even["standard_error"] < grouped["standard_error"] / 2
    # every group the same: nothing to subtract; groups that do not cover the batches are a caller's bug
    same = analysis.accuracy(ref, ref, ["logits"], groups=[3, 3])["outputs"]["logits"]
    assert same["value"] == 1.0 and same["standard_error"] == 0.0
    with pytest.raises(ValueError, match="cover 4 batches"):
        analysis.accuracy(ref, one_photo, ["logits"], groups=[2, 2])
    # single samples are merged into groups of 8: 6 samples make no group, 16 make two
    from edgedeploy.precision.heldout import expected_top1_agreement

    singles = [{"logits": r["logits"][i : i + 1]} for r in ref[:1] for i in range(16)]
    moved = [{"logits": c["logits"][i : i + 1]} for c in one_photo[:1] for i in range(16)]
    moved[3]["logits"] = moved[3]["logits"] + rng.normal(scale=3.0, size=(1, 30))
    few = analysis.accuracy(singles[:6], moved[:6], ["logits"], groups=[1] * 6)["outputs"]["logits"]
    assert few["standard_error"] == 0.0
    two = analysis.accuracy(singles, moved, ["logits"], groups=[1] * 16)["outputs"]["logits"]
    halves = [
        expected_top1_agreement(
            np.concatenate([b["logits"] for b in singles[a : a + 8]]),
            np.concatenate([b["logits"] for b in moved[a : a + 8]]),
        )
        for a in (0, 8)
    ]
    assert two["standard_error"] > 0
    assert two["standard_error"] == pytest.approx(float(np.std(halves, ddof=1) / np.sqrt(2)))


def test_held_out_views_are_the_photo_its_mirror_and_four_corner_crops() -> None:
    import skimage.data

    from edgedeploy.precision.heldout import VIEW_CROP, heldout_views

    pic = skimage.data.astronaut()  # a real photo, (512, 512, 3) uint8
    nhwc = np.stack([pic[:48, :64], pic[48:96, 64:128]]).astype(np.float32) / 255.0  # two samples, 48 x 64
    nchw = np.ascontiguousarray(nhwc.transpose(0, 3, 1, 2))
    views = heldout_views([{"image": nchw}], "NCHW")
    assert len(views) == 6 and all(v["image"].shape == nchw.shape and v["image"].dtype == np.float32 for v in views)
    assert np.array_equal(views[0]["image"], nchw) and np.array_equal(views[1]["image"], nchw[..., ::-1])
    # INT8 builds round every view to float16 values (goldens.npz keeps them exactly in half the bytes): the
    # photo itself moves by under 2**-11 of each value; the crops are the same crops, rounded
    halved = heldout_views([{"image": nchw}], "NCHW", half_grid=True)
    half = nchw.astype(np.float16).astype(np.float32)
    assert not np.array_equal(half, nchw) and np.allclose(half, nchw, rtol=2**-11, atol=0)
    assert np.array_equal(halved[0]["image"], half) and np.array_equal(halved[1]["image"], half[..., ::-1])
    assert all(
        np.array_equal(h["image"], v["image"].astype(np.float16).astype(np.float32)) for h, v in zip(halved, views)
    )
    crops = [v["image"] for v in views[2:]]
    assert all(not np.allclose(c, nchw, atol=1e-3) for c in crops)
    assert all(not np.allclose(a, b, atol=1e-3) for i, a in enumerate(crops) for b in crops[i + 1 :])
    # a horizontal ramp shows which columns each crop came from: left crops span the left 80 %, right the right
    ramp = np.broadcast_to(np.arange(64, dtype=np.float32), (1, 1, 48, 64)).copy()
    tl, tr, bl, br = (v["image"] for v in heldout_views([{"image": ramp}], "NCHW")[2:])
    assert tl.max() <= 64 * VIEW_CROP and tr.min() >= 64 * (1 - VIEW_CROP) - 1 and np.array_equal(tl, bl)
    assert np.array_equal(tr, br)
    # NHWC gives the same views, transposed; a non-image batch is judged as it is
    views_hwc = heldout_views([{"image": nhwc}], "NHWC")
    assert all(np.allclose(a["image"], b["image"].transpose(0, 3, 1, 2)) for a, b in zip(views, views_hwc))
    tokens = [{"ids": np.zeros((2, 8), np.int64)}]
    assert heldout_views(tokens, "NCHW") == tokens
    # views stop multiplying at max_samples: 2 samples, at most 9 judged -> 4 views; 96 and more -> none
    assert len(heldout_views([{"image": nchw}], "NCHW", max_samples=9)) == 4
    assert len(heldout_views([{"image": nchw}], "NCHW", max_samples=2)) == 1
    # a view with a value beyond float16's range is kept as it is, in float32
    bright = nchw * 1e5
    assert np.array_equal(heldout_views([{"image": bright}], "NCHW", half_grid=True)[0]["image"], bright)
