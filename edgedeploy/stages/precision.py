"""PrecisionFromOnnx: FP16 / INT8 versions of model.onnx that keep accuracy; FP32 builds skip this stage.

INT8: a QDQ model calibrated on the user's data in the target's flavour (S8S8 for TensorRT, U8S8 for
ONNX Runtime), the most sensitive layers left in float until ``precision.accuracy_target`` is met, and, for
TensorRT releases with implicit INT8, a ``calib.cache`` written from the same ranges.
FP16: activation ranges on the calibration data; layers that overflow FP16 are pinned to FP32, either as
builder pins (TensorRT <= 10) or inside an FP16 ONNX model (strongly typed TensorRT 11).
Everything decided goes into ``precision.json`` and the stage metrics (report.json).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy import stagenames as names
from edgedeploy.artifacts import CALIBRATION, ONNX_MODEL, PRECISION_JSON, PRECISION_MODELS, deploy_model_name  # noqa: F401
from edgedeploy.errors import StageError
from edgedeploy.fileio.stable import stable_json
from edgedeploy.stages.base import Stage
from edgedeploy.stages.context import BuildContext


class PrecisionFromOnnx(Stage):
    name = names.PRECISION
    version = "3"  # 3: 7-bit weights (reduce_range) in the onnxruntime QDQ flavour
    consumes = (ONNX_MODEL,)

    def inputs(self, ctx: BuildContext) -> tuple[str, ...]:
        # a calibration file is an input; a folder or callable is fingerprinted in config_key
        return (CALIBRATION,) if CALIBRATION in ctx.external else ()

    def applies(self, ctx: BuildContext) -> str | None:
        return "fp32: nothing to convert" if ctx.precision == "fp32" else None

    def outputs(self, ctx: BuildContext) -> tuple[str, ...]:
        from edgedeploy.precision.calib_cache import CALIB_CACHE

        files = [deploy_model_name(ctx.precision), PRECISION_JSON]
        if ctx.precision == "int8" and ctx.target.implicit_int8:
            files.append(CALIB_CACHE)
        return tuple(files)

    def config_key(self, ctx: BuildContext) -> Any:
        from edgedeploy.precision.data import calibration_fingerprint

        c = ctx.cfg
        t = ctx.target
        return {
            "precision": c.to_dict()["precision"],
            "calibration": calibration_fingerprint(c),
            "target": [t.runtime, t.trt_version, t.implicit_int8, t.strongly_typed_only],
            "normalization": c.model.normalization,
            "classifier_outputs": list(c.validate.classifier_outputs),
            "latency": [c.validate.latency_iters, c.validate.seed],
        }

    def run(self, ctx: BuildContext) -> dict[str, Any]:
        from edgedeploy.precision.data import load_calibration

        cfg = ctx.cfg
        calib = load_calibration(cfg, allow_random=ctx.precision == "fp16")
        _warn_about_data(ctx, calib)
        with tempfile.TemporaryDirectory(prefix="precision-", dir=ctx.staging) as tmp:
            if ctx.precision == "int8":
                plan = _int8(ctx, calib.batches, Path(tmp))
            else:
                plan = _fp16(ctx, calib.batches, Path(tmp))
        plan = {"precision": ctx.precision, "target": ctx.target.name, "calibration": calib.provenance(), **plan}
        # precision.json is hashed into the bundle: timings stay in the returned metrics (the report) only
        (ctx.staging / PRECISION_JSON).write_text(stable_json(plan))
        return plan


def _warn_about_data(ctx: BuildContext, calib: Any) -> None:
    p = ctx.cfg.precision
    if calib.kind == "random":
        ctx.warn("no calibration data: FP16 ranges measured on spec-random inputs; pass --calib for real ranges")
    elif calib.samples < p.calib_samples:
        ctx.warn(
            f"calibration used {calib.samples} samples, fewer than precision.calib_samples = {p.calib_samples} "
            f"({calib.location}); ranges may miss real inputs"
        )
    for spec in ctx.cfg.inputs:
        if spec.dtype not in ("float32", "float16"):
            continue
        values = np.concatenate([b[spec.name].ravel() for b in calib.batches])
        lo, hi = float(values.min()), float(values.max())
        slack = 0.05 * (spec.range[1] - spec.range[0])
        if lo < spec.range[0] - slack or hi > spec.range[1] + slack:
            ctx.warn(
                f"calibration data for {spec.name!r} spans [{lo:.3g}, {hi:.3g}], outside inputs.range "
                f"{list(spec.range)} that validation draws from; fix inputs.range or the preprocessing"
            )


def _int8(ctx: BuildContext, batches: Any, tmp: Path) -> dict[str, Any]:
    import onnx

    from edgedeploy.precision.calib_cache import CALIB_CACHE, scales_from_ranges, write_trt_cache
    from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess, quantize_with_fallback

    cfg, target = ctx.cfg, ctx.target
    p = cfg.precision
    float_model = preprocess(ctx.path(ONNX_MODEL), tmp / "float.onnx")
    _check_node_names(p.keep_fp32, onnx.load(str(float_model)), "precision.keep_fp32")
    from edgedeploy.precision.transformer import choose_recipe

    recipe, evidence = choose_recipe(p.int8_recipe, onnx.load(str(float_model)))
    if recipe == "transformer":
        return _int8_transformer(ctx, float_model, batches, tmp, evidence)
    flavour = flavour_for(target.runtime)
    q = Quantizer(float_model, tmp, flavour, method=p.calib_method, per_channel=p.per_channel)
    result = quantize_with_fallback(
        q,
        out=ctx.staging / deploy_model_name("int8"),
        batches=batches,
        classifier_outputs=cfg.validate.classifier_outputs,
        accuracy_target=p.accuracy_target,
        max_tries=p.max_fallback_tries,
        keep_fp32=p.keep_fp32,
        latency_feeds=batches[0],
        latency_iters=max(cfg.validate.latency_iters, 3),
        log=(lambda line: ctx.log(f"  {line}")) if ctx.log else None,
    )
    if not result.met:
        table = "; ".join(
            f"try {t['try']}: {len(t['excluded'])} float nodes, {t['metric']} {t['score']:.4f}" for t in result.tries
        )
        raise StageError(
            "precision",
            f"INT8 misses precision.accuracy_target = {p.accuracy_target} after {len(result.tries) - 1} "
            f"fallback tries ({table})",
            hint="raise precision.max_fallback_tries, add calibration data, try calib_method = 'entropy' or "
            "'percentile', or list layers in precision.keep_fp32",
        )
    if result.excluded:
        ctx.warn(
            f"INT8: {len(result.excluded)} node(s) kept in float for accuracy: "
            + ", ".join(list(result.excluded)[:6])
            + (" ..." if len(result.excluded) > 6 else "")
        )
    plan: dict[str, Any] = {
        "strategy": "explicit-qdq",
        "qdq_flavour": {"name": flavour.name, "why": flavour.why, "per_channel": p.per_channel},
        "calib_method": p.calib_method,
        "accuracy_target": p.accuracy_target,
        "accuracy": result.tries[-1],
        "kept_float": [{"node": n, "why": why} for n, why in result.excluded.items()],
        "fallback_tries": result.tries,
        "sensitivity": result.sensitivity,
        "latency_onnxruntime_cpu": result.latency,
    }
    if target.implicit_int8:
        # sorted: the calibrator's ranges come in a different order each run; TensorRT reads the cache as a map
        scales = dict(sorted(scales_from_ranges(q.ranges()).items()))
        cache = write_trt_cache(ctx.staging / CALIB_CACHE, scales, trt_version=target.trt_version)
        plan["implicit_int8"] = {"calib_cache": CALIB_CACHE, "header": cache.header, "tensors": len(cache.scales)}
    return plan


def _int8_transformer(
    ctx: BuildContext, float_model: Path, batches: Any, tmp: Path, evidence: dict[str, int]
) -> dict[str, Any]:
    """INT8 of a transformer graph: weight MatMuls only, in the scheme of the target's runtime
    (edgedeploy/precision/transformer.py), judged on held-out calibration batches."""
    from edgedeploy.precision.analysis import measure_latency
    from edgedeploy.precision.calib_cache import CALIB_CACHE, scales_from_ranges, write_trt_cache
    from edgedeploy.precision.transformer import host_has_int8_dot, quantize_transformer, scheme_for

    cfg, target, p = ctx.cfg, ctx.target, ctx.cfg.precision
    scheme = scheme_for(target.runtime)
    int8_dot = host_has_int8_dot()
    # 7-bit weights only where uint8 x int8 products saturate int16 (x86 without VNNI, ORT's dynamic U8S8);
    # an explicit precision.reduce_range = true/false (the CNN path's field, where present) wins
    setting = getattr(p, "reduce_range", "auto")
    reduce_range = (scheme.activations == "dynamic" and int8_dot is False) if setting == "auto" else bool(setting)
    out = ctx.staging / deploy_model_name("int8")
    result, plan, q = quantize_transformer(
        float_model, out, tmp, scheme=scheme, batches=batches, classifier_outputs=cfg.validate.classifier_outputs,
        accuracy_target=p.accuracy_target, max_tries=p.max_fallback_tries, keep_fp32=p.keep_fp32,
        smoothquant_alpha=p.smoothquant_alpha, per_channel=p.per_channel, reduce_range=reduce_range,
        log=(lambda line: ctx.log(f"  {line}")) if ctx.log else None,
    )  # fmt: skip
    last = result.tries[-1]
    if not plan["held_out"]["disjoint"]:
        ctx.warn("INT8 judged on its own calibration data (one batch: nothing to hold out); add calibration samples")
    if not result.met:
        table = "; ".join(f"try {t['try']}: {t['float_matmuls']} float MatMuls, {t['metric']} {t['score']:.4f}"
                          for t in result.tries)  # fmt: skip
        fixes = ["list layers in precision.keep_fp32"]
        if p.max_fallback_tries == 0 or len(result.sensitivity) > 2 ** (len(result.tries) - 2):
            fixes.insert(0, "raise precision.max_fallback_tries")
        if p.smoothquant_alpha == 0:
            fixes.insert(0, "set precision.smoothquant_alpha = 0.5")
        raise StageError(
            "precision",
            f"transformer INT8 misses precision.accuracy_target = {p.accuracy_target} on held-out calibration "
            f"data after {len(result.tries) - 1} fallback tries ({table})",
            hint=", or ".join(fixes),
        )
    if plan["absurd_ranges"]:
        ctx.log(f"  INT8: {len(plan['absurd_ranges'])} tensor(s) with absurd ranges (masks) kept float")
    sensitive = [n for n, why in result.kept_float.items() if why.startswith("INT8 sensitive")]
    if sensitive:
        ctx.warn(f"INT8: {len(sensitive)} MatMul(s) kept in float for accuracy: " + ", ".join(sensitive[:6]))
    iters = max(cfg.validate.latency_iters, 3)
    lat = {
        "fp32": measure_latency(float_model, batches[0], warmup=2, iters=iters),
        "int8_final": measure_latency(out, batches[0], warmup=2, iters=iters),
    }
    plan = {
        "strategy": f"transformer-{scheme.name}",
        "int8_recipe": {"setting": p.int8_recipe, "chosen": "transformer", "evidence": evidence},
        **plan,
        "host_int8_dot_product": int8_dot,
        "accuracy_target": p.accuracy_target,
        "accuracy": last,
        "kept_float": [{"node": n, "why": why} for n, why in result.kept_float.items()],
        "fallback_tries": result.tries,
        "sensitivity": result.sensitivity,
        "latency_onnxruntime_cpu": lat,
    }
    if target.implicit_int8:
        absurd = {a["tensor"] for a in plan["absurd_ranges"]}
        cache = write_trt_cache(
            ctx.staging / CALIB_CACHE,
            scales_from_ranges({k: v for k, v in q.ranges().items() if k not in absurd}),
            trt_version=target.trt_version,
        )
        plan["implicit_int8"] = {"calib_cache": CALIB_CACHE, "header": cache.header, "tensors": len(cache.scales)}
    return plan


def _fp16(ctx: BuildContext, batches: Any, tmp: Path) -> dict[str, Any]:
    import onnx

    from edgedeploy.precision import analysis
    from edgedeploy.precision.fp16 import convert_fp16, fp16_strategy

    cfg, target = ctx.cfg, ctx.target
    model_path = ctx.path(ONNX_MODEL)
    proto = onnx.load(str(model_path))
    _check_node_names(cfg.precision.keep_fp32, proto, "precision.keep_fp32")
    findings = analysis.fp16_findings(analysis.tensor_ranges(model_path, batches, tmp), proto)
    pins = {n: "listed in precision.keep_fp32" for n in cfg.precision.keep_fp32}
    pins.update({n: why for n, why in analysis.fp16_pins(findings).items() if n not in pins})
    for f in findings:
        if f["issue"] == "underflow":
            ctx.warn(f"FP16 underflow in {f['tensor']} ({f['producer']}): {f['why']}")
    if pins:
        ctx.warn(f"FP16: {len(pins)} node(s) pinned to FP32: " + ", ".join(list(pins)[:6]))
    fp16_model = convert_fp16(model_path, tmp / "fp16.onnx", keep_fp32=list(pins))
    # Host check of the pinned FP16 graph in ONNX Runtime: NaN/Inf left after pinning is a hard failure.
    reference = analysis.run_model(model_path, batches)
    outputs = analysis.run_model(fp16_model, batches)
    nonfinite = sorted({n for o in outputs for n, v in o.items() if v.dtype.kind == "f" and not np.isfinite(v).all()})
    if nonfinite:
        raise StageError(
            "precision",
            f"FP16 model still gives NaN/Inf in {', '.join(nonfinite)} after pinning {len(pins)} node(s) to FP32",
            hint="list the offending layers in precision.keep_fp32",
        )
    check = analysis.accuracy(reference, outputs, cfg.validate.classifier_outputs)
    if check["score"] < cfg.precision.accuracy_target:
        ctx.warn(
            f"FP16 host check: {check['metric']} {check['score']:.4f} < precision.accuracy_target "
            f"{cfg.precision.accuracy_target} (ONNX Runtime CPU FP16; the device's numerics differ)"
        )
    strategy = fp16_strategy(target.strongly_typed_only)
    out = ctx.staging / deploy_model_name("fp16")
    if strategy == "typed-onnx":
        shutil.copyfile(fp16_model, out)
    else:  # TensorRT <= 10: the FP32 graph; the builder sets the FP16 flag and pins these layers to FP32
        shutil.copyfile(model_path, out)
    return {
        "strategy": strategy,
        "onnx_dtype": "float16" if strategy == "typed-onnx" else "float32",
        "fp32_layers": [{"node": n, "why": why} for n, why in pins.items()],
        "fp16_findings": findings,
        "host_check": check,
    }


def _check_node_names(names: Any, model: Any, key: str) -> None:
    known = {n.name for n in model.graph.node}
    unknown = [n for n in names if n not in known]
    if unknown:
        from edgedeploy.errors import ConfigError

        raise ConfigError(
            f"key '{key}' names nodes not in model.onnx: {', '.join(unknown[:5])}",
            hint="use ONNX node names (e.g. from precision.json or Netron)",
        )
