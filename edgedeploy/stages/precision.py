"""PrecisionFromOnnx: FP16 / INT8 versions of model.onnx that keep accuracy; FP32 builds skip this stage.

INT8: a QDQ model calibrated on the user's data in the target's flavour (S8S8 for TensorRT, U8S8 for
ONNX Runtime), the most sensitive layers left in float until ``precision.accuracy_target`` is met, and, for
TensorRT releases with implicit INT8, a ``calib.cache`` written from the same ranges.
FP16: activation ranges on the calibration data; layers that overflow FP16 are pinned to FP32, either as
builder pins (TensorRT <= 10) or inside an FP16 ONNX model (strongly typed TensorRT 11).
Everything decided goes into ``precision.json`` and the stage metrics (report.json).
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgedeploy import stagenames as names
from edgedeploy.artifacts import (
    CALIB_CODE,
    CALIBRATION,
    FP16_SIMULATED,
    GOLDENS,
    ONNX_DATA,
    ONNX_MODEL,
    PRECISION_JSON,
    deploy_model_name,
)
from edgedeploy.errors import StageError
from edgedeploy.fileio.stable import stable_json
from edgedeploy.stages.base import BuildContext, Stage, StageResult, partial_result

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edgedeploy.precision.data import CalibrationSet

    Feeds = dict[str, np.ndarray]  # one batch: input name -> array


class PrecisionFromOnnx(Stage):
    name = names.PRECISION
    # 6: judged on 32 views per held-out photo: lower of observed and expected top-1, less one SE
    # 7: the goldens' pooled top-1 within one standard error; cpu: the faster of both families' passing sets
    # 8: calibration_range per input; each fallback try timed (p50_ms, in the report only)
    # 9: real samples judge FP16/INT8 agreement (one judge); no INT8 compute refused; the FP16 simulation kept
    # 10: Q/DQ placed for TensorRT's fusions; equalization scores bias correction first; precision.time_budget_s
    # 12: one-pass calibration histograms; on this host's kernels rung b searches a float prefix first
    # 13: fallback and ranking models made from the first quantized model by graph surgery (float_subset); a
    #     try's judging stops once the target is out of reach
    # 14: the speed probe asked of the model the search would ship, after it (none where a float prefix covers it)
    # 15: INT8: held-out image views rounded to float16 values (goldens.npz stores them exactly in half the bytes)
    # 16: FP16 judged by the goldens veto at tolerance.fp16 (in the key); short outputs pooled about their mean
    # 17: integer outputs judged by exact agreement; one calibration batch refused without validate.data; tries
    #     count pinned float nodes apart
    # 18: INT8 bias correction takes the float conv means from the calibration pass (its own float run gone)
    version = "18"
    consumes = (ONNX_MODEL,)
    optional = (ONNX_DATA, GOLDENS)  # goldens, when the reference ran: INT8 candidates must pass them

    def inputs(self, ctx: BuildContext) -> tuple[str, ...]:
        # a calibration file is an input, and so is a callable's code (its module and what it imports);
        # a folder is fingerprinted in config_key
        return tuple(name for name in (CALIBRATION, CALIB_CODE) if ctx.has_input(name))

    def applies(self, ctx: BuildContext) -> str | None:
        return "fp32: nothing to convert" if ctx.precision == "fp32" else None

    def outputs(self, ctx: BuildContext) -> tuple[str, ...]:
        from edgedeploy.precision.calib_cache import CALIB_CACHE
        from edgedeploy.precision.fp16 import fp16_strategy

        files = [deploy_model_name(ctx.precision), PRECISION_JSON]
        if ctx.precision == "fp16" and fp16_strategy(ctx.target.strongly_typed_only) == "builder-flag":
            # TensorRT <= 10: the FP32 graph + builder flag + pins, and the FP16 simulation the build judged,
            # which the bundle's dry run runs
            files = [PRECISION_JSON, FP16_SIMULATED]
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
            "target": [t.name, t.runtime, t.trt_version, t.implicit_int8, t.strongly_typed_only],  # precision.json
            "cpu_int8": list(_cpu_flags()) if ctx.precision == "int8" and _host_kernels(t.runtime) else [],
            # the tolerance the stage's goldens veto judges at (INT8 candidates, the FP16 dry-run model)
            "tolerance": ctx.cfg.tolerance_for(ctx.precision).__dict__ if ctx.precision != "fp32" else None,
            "normalization": c.model.normalization,
            "classifier_outputs": list(c.validate.classifier_outputs),
            "latency": [c.validate.latency_iters, c.validate.seed],
        }

    def run(self, ctx: BuildContext) -> StageResult:
        from edgedeploy.precision.data import load_calibration, require_heldout

        cfg = ctx.cfg
        result = StageResult()
        warnings = result.warnings
        with partial_result(result):  # warnings given before a failure reach the failure report
            calib = load_calibration(cfg, allow_random=ctx.precision == "fp16")
            if ctx.precision == "int8":
                require_heldout(calib, judged_elsewhere=bool(cfg.validate.data))
            ranges = calibration_ranges(ctx, calib)
            warnings += _data_warnings(ctx, calib, ranges)
            with tempfile.TemporaryDirectory(prefix="precision-", dir=ctx.staging) as tmp:
                if ctx.precision == "int8":
                    plan = _int8(ctx, calib.batches, Path(tmp), warnings, kind=calib.kind)
                else:
                    plan = _fp16(ctx, calib.batches, Path(tmp), warnings)
        plan = {"precision": ctx.precision, "target": ctx.target.name, "calibration": calib.provenance(), **plan}
        plan["calibration_range"] = ranges
        # precision.json is hashed into the bundle: timings stay in the returned metrics (the report) only
        (ctx.staging / PRECISION_JSON).write_text(stable_json(plan))
        result.metrics = plan
        if ctx.precision == "int8" and _host_kernels(ctx.target.runtime):
            result.metrics = {**plan, **_speedup(plan.get("latency_onnxruntime_cpu") or {}, warnings)}
        return result


# FP32 faster than this: whether INT8 is faster is timer noise (speedup_vs_fp32 recorded, no line)
# rung b ranks up to this many quantized nodes by one quantization each, larger graphs in one pass
TRIAL_RANKING_MAX = 96
MIN_MS = 1.0


def _speedup(latency: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """``speedup_vs_fp32`` of the INT8 model on this CPU (ONNX Runtime, the stage's own timing of both models on
    the first calibration batch), and one line when INT8 is not faster: it then buys nothing here."""
    try:
        fp32, int8 = float(latency["fp32"]["p50_ms"]), float(latency["int8_final"]["p50_ms"])
    except (KeyError, TypeError, ValueError):
        return {"speedup_vs_fp32": None}
    speedup = round(fp32 / max(int8, 1e-9), 3)
    if speedup <= 1.0 and fp32 >= MIN_MS:  # under a millisecond the difference is timer noise: recorded only
        line = (
            f"INT8 is not faster than FP32 on this CPU: p50 {int8:.3f} ms vs {fp32:.3f} ms (speedup_vs_fp32 "
            f"{speedup:.2f}); FP32 gives the same speed at full accuracy"
        )
        warnings.append(line)  # printed once, as the build's warnings are
    return {"speedup_vs_fp32": speedup}


def _cpu_flags() -> tuple[str, ...]:
    from edgedeploy.precision.quantize import cpu_int8_flags

    return cpu_int8_flags()


def _host_kernels(runtime: str) -> bool:
    """Whether the runtime's INT8 runs on this CPU's kernels (its VNNI/AMX flags then shape the INT8 model)."""
    from edgedeploy.precision.quantize import flavour_for

    return flavour_for(runtime).host_cpu_kernels


def _accuracy_target(ctx: BuildContext, model: Any) -> tuple[float, str]:
    """(held-out target, why) for ``model``'s outputs: precision.accuracy_target, else the default by metric."""
    from edgedeploy.precision.heldout import COSINE_TARGET, accuracy_target_for

    cfg = ctx.cfg
    top1 = cfg.tolerance_for(ctx.precision).min_topk_agreement
    if top1 is None and ctx.precision == "fp16":  # FP16 rounding should flip next to no top-1 answer
        top1 = COSINE_TARGET
    outputs = [o.name for o in model.graph.output]
    return accuracy_target_for(cfg.precision.accuracy_target, outputs, cfg.validate.classifier_outputs, top1)


def _target_text(ctx: BuildContext, target: float) -> str:
    """How a failure names the target: the user's key, or the default it came from."""
    if ctx.cfg.precision.accuracy_target is not None:
        return f"precision.accuracy_target = {target}"
    return f"the default held-out target {target} (set precision.accuracy_target to change it)"


def _data_warnings(ctx: BuildContext, calib: CalibrationSet, ranges: dict[str, dict[str, Any]]) -> list[str]:
    """What the user should know about the calibration data: random, too few samples, out of inputs.range."""
    warnings: list[str] = []
    p = ctx.cfg.precision
    if calib.kind == "random":
        warnings.append("no calibration data: FP16 ranges measured on spec-random inputs; pass --calib for real ranges")
    elif calib.samples < p.calib_samples:
        warnings.append(
            f"calibration used {calib.samples} samples, fewer than precision.calib_samples = {p.calib_samples} "
            f"({calib.location}); ranges may miss real inputs"
        )
    for name, row in ranges.items():
        if row["outside"]:
            lo, hi = row["data"]
            warnings.append(
                f"calibration data for {name!r} spans [{lo:.3g}, {hi:.3g}], outside inputs.range "
                f"{row['declared']} that validation draws from; fix inputs.range or the preprocessing"
            )
    return warnings


def calibration_ranges(ctx: BuildContext, calib: CalibrationSet) -> dict[str, dict[str, Any]]:
    """Per float input: the calibration data's [min, max], its 1st-99th percentile, the declared inputs.range,
    and whether the data leaves the declared range by more than 5 % of its width (report.html plots them)."""
    ranges: dict[str, dict[str, Any]] = {}
    for spec in ctx.cfg.inputs:
        if spec.dtype not in ("float32", "float16"):
            continue
        values = np.concatenate([b[spec.name].ravel() for b in calib.batches])
        lo, hi = float(values.min()), float(values.max())
        p1, p99 = (float(v) for v in np.percentile(values, [1, 99]))
        slack = 0.05 * (spec.range[1] - spec.range[0])
        ranges[spec.name] = {
            "data": [lo, hi],
            "data_p1_p99": [p1, p99],
            "declared": [float(v) for v in spec.range],
            "outside": bool(lo < spec.range[0] - slack or hi > spec.range[1] + slack),
        }
    return ranges


def _int8(
    ctx: BuildContext, batches: Sequence[Feeds], tmp: Path, warnings: list[str], *, kind: str = ""
) -> dict[str, Any]:
    import shutil

    import onnx

    from edgedeploy.precision import analysis
    from edgedeploy.precision.calib_cache import CALIB_CACHE, scales_from_ranges, write_trt_cache
    from edgedeploy.precision.data import split_for_judging, split_heldout
    from edgedeploy.precision.fallback import quantize_with_fallback
    from edgedeploy.precision.quantize import (
        RANGES,
        Quantizer,
        calib_method_for,
        cpu_int8_flags,
        flavour_for,
        preprocess,
        reduce_range_choices,
    )

    cfg, target = ctx.cfg, ctx.target
    import time

    budget = cfg.precision.time_budget_s  # the whole CNN INT8 search, from here
    deadline = time.monotonic() + budget if budget is not None else None
    float_model = preprocess(ctx.path(ONNX_MODEL), tmp / "float.onnx")
    float_proto = onnx.load(str(float_model))
    method, method_why = calib_method_for(
        cfg.precision.calib_method, [o.name for o in float_proto.graph.output], cfg.validate.classifier_outputs
    )
    p = dataclasses.replace(cfg.precision, calib_method=method)  # every quantizer below takes the resolved method
    analysis.check_node_names(p.keep_fp32, float_proto, "precision.keep_fp32")
    accuracy_target, target_why = _accuracy_target(ctx, float_proto)
    from edgedeploy.precision.transformer import choose_recipe

    recipe, evidence = choose_recipe(p.int8_recipe, float_proto)
    del float_proto  # a real model's graph: not kept through the search
    if recipe == "transformer":
        return _int8_transformer(ctx, float_model, batches, tmp, evidence, warnings, (accuracy_target, target_why))
    flavour = flavour_for(target.runtime)
    calib, held = split_for_judging(batches, kind, p.calib_layout, wide=True, half_grid=True)
    held_batches = len(split_heldout(batches)[1])
    judged: dict[str, Any] = {"heldout_batches": held_batches}
    if len(held) > held_batches:  # an image folder: each held-out photo judged on views of it
        judged["views_per_heldout_batch"] = len(held) // held_batches
    from edgedeploy.precision.goldens_veto import golden_cases, goldens_veto

    goldens = golden_cases(ctx.path(GOLDENS))
    # validate.data only: without it a "data" golden is a calibration batch (nothing held out), not new evidence
    real_data = [feeds for point, feeds, _, _ in goldens if point == "data"] if cfg.validate.data else []
    evals = held + real_data  # never empty: the stage refuses one calibration batch without validate.data
    judged.update(validate_data_batches=len(real_data), calibration_batches=len(calib))
    judged["samples"] = sum(len(next(iter(b.values()))) for b in evals) if evals else 0
    # independent sources among the judged batches: each held-out batch with its views, each validate.data batch
    groups = ([len(held) // held_batches] * held_batches if held_batches else []) + [1] * len(real_data)
    # the score is lowered by one standard error over these (groups under 8 samples are merged first)
    judged["independent_groups"] = len(groups)
    # the goldens' real samples are among the judged views: a candidate's judged outputs serve its veto too
    golden_views = analysis.shared_inputs([feeds for _, feeds, _, _ in goldens], evals) if goldens else {}

    def veto(model: Path, judged_outputs: Sequence[Feeds]) -> str | None:
        known = {c: judged_outputs[e] for c, e in golden_views.items() if e < len(judged_outputs)}
        return goldens_veto(cfg, model, goldens, known, qdq_as_written=flavour.qdq_as_written)

    from edgedeploy.precision.equalize_choice import choose_equalization
    from edgedeploy.precision.layer_error import layer_errors
    from edgedeploy.precision.rounding_choice import choose_rounding
    from edgedeploy.precision.search_progress import SearchProgress
    from edgedeploy.precision.speed_probe import probe_when_set, side_by_side_timer, undecided_too_small
    from edgedeploy.precision.speed_probe import skipped as skipped_probe

    log = (lambda line: ctx.log(f"  {line}")) if ctx.log else None
    classes = cfg.validate.classifier_outputs
    plain_model = float_model
    pinned = {n: "listed in precision.keep_fp32" for n in p.keep_fp32}

    def rung(expensive: bool) -> dict[str, Any]:
        """One pass of the INT8 search: bias correction (CLE measured when ``expensive``), the weight width,
        the rounding (AdaRound learned when ``expensive`` or asked for), then the fewest float nodes that meet
        the target (the worst ranked in one pass, or the first in graph order; ``expensive``: ranked by one
        quantization per node, the faster passing set timed)."""
        work = tmp / ("rung_c" if expensive else "rung_a")  # each rung calibrates its own float model
        work.mkdir()
        if expensive and (tmp / "rung_a" / RANGES).is_file():  # the unmodified model's ranges: calibrated once
            (work / "eq_float").mkdir()
            shutil.copyfile(tmp / "rung_a" / RANGES, work / "eq_float" / RANGES)
        model, equalized, bias = choose_equalization(
            p.equalize, plain_model, calib, evals or calib, work, flavour, p, classes, target=accuracy_target,
            measure=expensive,
        )  # fmt: skip
        if bias.calibrated is not None:  # the equalization choice calibrated this very model on these batches
            Quantizer(model, work, flavour, method=p.calib_method).adopt_ranges(bias.calibrated)
        choices, rr_why = reduce_range_choices(p.reduce_range, target.runtime, cpu_int8_flags())
        reduce_range, rr_scores = choices[0], {}
        reference = None  # the float model's outputs on the held-out data, computed once when needed
        if len(choices) > 1:  # measured, not assumed: the naive model with each weight width on the held-out data
            reference = analysis.run_model(model, evals or calib)
            for choice in choices:
                trial = Quantizer(model, work, flavour, method=p.calib_method, per_channel=p.per_channel)
                trial.reduce_range = choice
                bias.configure(trial, fresh=True)
                m = trial.quantize(work / f"rr{int(choice)}.int8.onnx", calib, exclude=list(p.keep_fp32))
                rr_scores["7-bit" if choice else "8-bit"] = analysis.accuracy(
                    reference, analysis.run_model(m, evals or calib, qdq_as_written=flavour.qdq_as_written), classes
                )["score"]
            reduce_range = rr_scores["7-bit"] > rr_scores["8-bit"]
        q = Quantizer(model, work, flavour, method=p.calib_method, per_channel=p.per_channel)
        q.reduce_range = reduce_range
        bias.configure(q, fresh=bool(rr_scores))  # the weight width measured: the equalize try's shifts do not apply
        if reference is None:
            reference = analysis.run_model(model, evals or calib)
        # AdaRound is learned when asked for (weight_rounding = "adaround"), or by "auto" in the expensive rung
        setting = p.weight_rounding if expensive or p.weight_rounding != "auto" else "nearest"
        rounding, first_try = choose_rounding(
            setting, q, calib, evals or calib, reference, exclude=list(pinned), target=accuracy_target,
            classifier_outputs=classes, workdir=work, log=log, groups=groups or None,
        )  # fmt: skip
        if setting != p.weight_rounding:
            rounding["why"] = "auto: round-to-nearest first (the cheapest rung); AdaRound only if it misses"

        def ranking(naive: Path, candidates: list[str]) -> list[dict[str, Any]]:
            # one quantization per node ranks by what each node costs at the model's outputs (on EfficientNet-Lite0
            # it met the target with fewer, faster float sets than the one-pass ranking, whose per-node SQNR misses
            # how error grows downstream); past TRIAL_RANKING_MAX nodes that costs too many quantizations
            if len(candidates) <= TRIAL_RANKING_MAX:
                from edgedeploy.precision.fallback import layer_sensitivity

                return layer_sensitivity(q, calib[:4], analysis.run_model(q.float_model, calib[:4]), candidates)
            return layer_errors(naive, q.float_model, calib, work, candidates, qdq_as_written=flavour.qdq_as_written)

        progress = SearchProgress(
            max_tries=p.max_fallback_tries,
            target=accuracy_target,
            status=ctx.status,
            # timed where the artifact runs on this host's kernels; a stand-in's Q/DQ graph as written says
            # nothing of the device's speed (and timing it cost the jetson-orin search 1.3 s)
            latency_feeds=calib[0] if flavour.host_cpu_kernels else None,
            latency_iters=max(3, min(cfg.validate.latency_iters, 10)),
            qdq_as_written=flavour.qdq_as_written,
        )
        result = quantize_with_fallback(
            q,
            out=ctx.staging / deploy_model_name("int8"),
            batches=calib,
            eval_batches=evals or None,
            classifier_outputs=classes,
            accuracy_target=accuracy_target,
            max_tries=p.max_fallback_tries,
            keep_fp32=pinned,
            first_try=first_try,
            reference=reference,
            extra_check=veto if goldens else None,
            latency_feeds=calib[0],
            latency_iters=max(cfg.validate.latency_iters, 3),
            log=log,
            groups=groups or None,
            timer=side_by_side_timer(calib[0]) if flavour.host_cpu_kernels and expensive else None,
            on_try=progress,
            deadline=deadline,
            ranking=ranking,
            # the cheap rung on this host's kernels: a float prefix first (no ranking; the fastest fallback)
            prefix_first=flavour.host_cpu_kernels and not expensive,
            # on this host's kernels a bisection ends once the nodes left could not make it measurably faster
            settled=undecided_too_small(q.float_model, calib[0]) if flavour.host_cpu_kernels else None,
            # speed, not accuracy: asked of the model this rung would ship (a float prefix usually covers it)
            speed_probe=lambda shipped, order: probe_when_set(
                p.float_when_faster, q, calib, shipped, order, runtime=target.runtime, log=log
            ),
        )
        if ctx.log:
            ctx.log(f"  {progress.summary(result.final)}")
        return {
            "q": q, "model": model, "equalized": equalized, "rr": (reduce_range, rr_why, rr_scores),
            "rounding": rounding, "result": result, "reference": reference,
        }  # fmt: skip

    cheap = rung(expensive=False)
    ladder = _ladder_note(cheap["result"])
    chosen = cheap
    expensive_left = _expensive_steps(p, plain_model, cheap["result"])
    out_of_time = deadline is not None and time.monotonic() >= deadline
    # a model that met the target only with so many float nodes that it runs no faster than FP32 here buys
    # nothing: the expensive rung may meet it with fewer (measured where the artifact runs on this host's kernels)
    cheap_speed = _measured_speedup(cheap["result"].latency) if flavour.host_cpu_kernels else None
    slow = cheap["result"].met and cheap_speed is not None and cheap_speed <= 1.0
    if (not cheap["result"].met or slow) and expensive_left and not out_of_time:
        cheap_model = tmp / "cheap.int8.onnx"  # the staged model is overwritten by the expensive rung's search
        shutil.copyfile(ctx.staging / deploy_model_name("int8"), cheap_model)
        why_c = (
            f"rung b met the target but runs at {cheap_speed:.2f}x FP32 here"
            if slow
            else f"the cheap rungs missed ({ladder['stop']})"
        )
        if ctx.log:
            ctx.log(f"  INT8: {why_c}: {', '.join(expensive_left)}")
        dear = rung(expensive=True)
        ladder["rungs"].append({**_rung_c_note(dear, expensive_left), "why": why_c})
        dear_speed = _measured_speedup(dear["result"].latency)
        if slow:
            faster = dear["result"].met and None not in (dear_speed, cheap_speed)
            if faster and dear_speed is not None and cheap_speed is not None:
                faster = dear_speed > cheap_speed
            if faster:
                chosen = dear
                ladder["stop"] = f"target met at rung c, {dear_speed:.2f}x FP32 where rung b ran {cheap_speed:.2f}x"
            else:
                shutil.copyfile(cheap_model, ctx.staging / deploy_model_name("int8"))
                ladder["stop"] = "target met at rung b; rung c found no faster model that meets it"
        elif dear["result"].met or not _better(cheap["result"], dear["result"]):
            chosen = dear
            ladder["stop"] = (
                "target met at rung c" if dear["result"].met else f"rung c missed too: {dear['result'].stop}"
            )
        else:
            shutil.copyfile(cheap_model, ctx.staging / deploy_model_name("int8"))
            ladder["stop"] = f"rung c missed and scored lower than rung b: {dear['result'].stop}"
    else:
        why = (
            "not needed: the target was met"
            if cheap["result"].met
            else "time budget: precision.time_budget_s spent"
            if out_of_time
            else f"nothing to add: {_nothing_expensive_why(p)}"
        )
        if not cheap["result"].met and out_of_time:
            ladder["stop"] = "time budget: precision.time_budget_s spent before rung c"
        elif not cheap["result"].met:
            ladder["stop"] = f"{ladder['stop']}; rung c has {why}"
        ladder["rungs"].append({"rung": "c", "ran": False, "why": why, "steps": expensive_left})
    q, float_model, equalized, rounding, result = (
        chosen["q"], chosen["model"], chosen["equalized"], chosen["rounding"], chosen["result"]
    )  # fmt: skip
    reduce_range, rr_why, rr_scores = chosen["rr"]
    reference = chosen["reference"]
    probe = result.probe or skipped_probe("the INT8 search met no target, so no model's speed was probed")
    if probe.kept:  # kept float for speed, not for accuracy, though the search's result lists them too
        pinned.update(probe.kept)
    from edgedeploy.precision.heldout import resolution_hint

    resolution = resolution_hint(str(result.final.get("metric", "")), judged["samples"], accuracy_target)
    if not result.met:
        table = "; ".join(
            f"try {t['try']}: {t['float_nodes']} float nodes"
            + (f" ({t['family']})" if t.get("family") else "")
            + f", {t['metric']} {t['score']:.4f}"
            + (f" ({t['vetoed']})" if "vetoed" in t else "")
            for t in result.tries
        )
        all_float = bool(result.sensitivity) and result.final.get("float_nodes", 0) >= len(result.sensitivity)
        hint = _int8_fixes(ctx, result.tries, accuracy_target, more_tries=not all_float)
        if "time_budget_s" in result.stop:
            hint = f"raise precision.time_budget_s (now {budget}) or drop it: the search stopped on time"
        raise StageError(
            "precision",
            f"INT8 misses {_target_text(ctx, accuracy_target)} on held-out data after "
            f"{len(result.tries) - 1} fallback tries ({table}; stopped: {result.stop})",
            hint=hint + resolution,
        )
    recurrent: dict[str, Any] = {"status": "skipped", "why": f"{target.runtime}: no INT8 LSTM kernel used here"}
    if flavour.host_cpu_kernels:  # ONNX Runtime's DynamicQuantizeLSTM: projections INT8, gates float
        from edgedeploy.precision.recurrent import lstm_int8

        final = ctx.staging / deploy_model_name("int8")
        recurrent = lstm_int8(
            final,
            tmp / "lstm.int8.onnx",
            eval_batches=evals or calib,
            reference=reference if reference is not None else analysis.run_model(float_model, evals or calib),
            target=accuracy_target,
            classifier_outputs=cfg.validate.classifier_outputs,
            exclude=list(p.keep_fp32),
            veto=(lambda model: goldens_veto(cfg, model, goldens)) if goldens else None,
            groups=groups or None,
        )
        if recurrent.get("kept"):
            import shutil

            shutil.copyfile(tmp / "lstm.int8.onnx", final)
            if isinstance(result.latency.get("int8_final"), dict):
                iters = max(cfg.validate.latency_iters, 3)
                result.latency["int8_final"] = analysis.measure_latency(final, calib[0], warmup=2, iters=iters)
    _refuse_without_int8_compute(ctx, ctx.staging / deploy_model_name("int8"), result, probe, pinned, accuracy_target)
    for why, nodes in (
        ("for accuracy", [n for n in result.excluded if n not in pinned]),
        ("because faster on this CPU (precision.float_when_faster)", list(probe.kept)),
    ):
        if nodes:
            more = " ..." if len(nodes) > 6 else ""
            warnings.append(f"INT8: {len(nodes)} node(s) kept in float {why}: " + ", ".join(nodes[:6]) + more)
    from edgedeploy.precision.fp16 import single_float_output_nodes

    typed_outputs = single_float_output_nodes(onnx.load(str(float_model)), list(result.excluded))
    plan: dict[str, Any] = {
        "strategy": "explicit-qdq",
        "qdq_flavour": {"name": flavour.name, "why": flavour.why, "per_channel": p.per_channel},
        "weights": {"bits": 7 if reduce_range else 8, "why": rr_why, "measured": rr_scores},
        "calib_method": {"name": p.calib_method, "why": method_why},
        "weight_rounding": rounding,
        "float_when_faster": probe.plan(),
        "equalize": equalized,
        "accuracy_target": {"value": accuracy_target, "why": target_why},
        "judged_on": judged,
        "accuracy": result.final,
        "kept_float": [
            {"node": n, "why": why, "pin_output_type": n in typed_outputs} for n, why in result.excluded.items()
        ],
        "fallback_tries": result.tries,
        "fallback_choice": result.choice,
        "recurrent_int8": recurrent,
        "fallback_stop": result.stop,
        **({"fallback_start": result.start} if result.start else {}),
        "search_ladder": ladder,
        "sensitivity": result.sensitivity,
        "latency_onnxruntime_cpu": result.latency,
    }
    if flavour.tensorrt_placement:  # what TensorRT's fusions see (precision/qdq_placement.py), checked on the file
        from edgedeploy.precision.qdq_placement import placement_findings

        final = onnx.load(str(ctx.staging / deploy_model_name("int8")), load_external_data=False)
        plan["qdq_placement"] = {
            "float_for_tensorrt": sorted(q.float_for_runtime()),
            "breaks": {k: len(v) for k, v in placement_findings(final, result.excluded).items()},
        }
    if target.implicit_int8:
        # sorted: the calibrator's ranges come in a different order each run; TensorRT reads the cache as a map
        scales = dict(sorted(scales_from_ranges(q.ranges()).items()))
        cache = write_trt_cache(ctx.staging / CALIB_CACHE, scales, trt_version=target.trt_version)
        plan["implicit_int8"] = {"calib_cache": CALIB_CACHE, "header": cache.header, "tensors": len(cache.scales)}
    return plan


def _ladder_note(result: Any) -> dict[str, Any]:
    """precision.json's account of the INT8 ladder's first two rungs (one search: its try 0 is rung a, its
    fallback tries rung b) and why it stopped there."""
    first = result.tries[0]
    measured: dict[str, Any] = {first["metric"]: round(first["score"], 6)}
    if "judged_samples" in first:  # the judge stopped once the target was out of reach
        measured.update(judged_samples=first["judged_samples"], samples=first["samples"])
    a: dict[str, Any] = {
        "rung": "a",
        "ran": True,
        "what": "every node INT8 as configured (per-channel weights, bias correction, round-to-nearest unless "
        "precision.weight_rounding asks otherwise), calibrated once, judged once on the held-out data",
        "measured": measured,
        "met": bool(first["met"]),
    }
    if "vetoed" in first:
        a["vetoed"] = first["vetoed"]
    if first["met"]:
        b: dict[str, Any] = {"rung": "b", "ran": False, "why": "not needed: rung a met the target"}
        return {"rungs": [a, b], "stop": "target met at rung a"}
    final = result.final
    b = {
        "rung": "b",
        "ran": len(result.tries) > 1,
        "what": "the fewest nodes kept float: on cpu the first in graph order first (one float -> INT8 boundary, "
        "no ranking); else, or when no prefix up to half the nodes passes, the worst ranked by what quantizing "
        f"each alone costs at the outputs (past {TRIAL_RANKING_MAX} nodes: in one pass by their own INT8 output "
        "error, precision/layer_error.py) or the first in graph order; each try one model (made from the first "
        "quantized one by graph surgery) and one batched judgement",
        "tries": len(result.tries) - 1,
        "float_nodes": final.get("float_nodes", 0),
        "measured": {final.get("metric", "score"): round(float(final.get("score", 0.0)), 6)},
        "met": bool(result.met),
        "stop": result.stop,
    }
    return {"rungs": [a, b], "stop": "target met at rung b" if result.met else result.stop}


def _expensive_steps(p: Any, model: Path, cheap: Any) -> list[str]:
    """What the expensive rung c would add after rungs a and b missed: ``cle`` (the CLE variants measured:
    ``equalize = auto`` on a depthwise CNN), ``adaround`` (``weight_rounding = auto``), and ``wide_search``
    (one quantization per node ranks them, both float-set families, timed) where rung b left float sets
    untried."""
    import onnx

    from edgedeploy.precision.equalize import has_depthwise_conv

    steps = []
    if p.equalize == "auto" and has_depthwise_conv(onnx.load(str(model), load_external_data=False)):
        steps.append("cle")
    if p.weight_rounding == "auto":
        steps.append("adaround")
    exhausted = cheap.stop.startswith("every ranked node float") or p.max_fallback_tries == 0
    if steps or not exhausted:
        steps.append("wide_search")
    return steps


def _nothing_expensive_why(p: Any) -> str:
    return (
        f"precision.equalize = {str(p.equalize).lower()}, precision.weight_rounding = {p.weight_rounding}, and "
        "more float nodes cannot change the outcome"
    )


def _rung_c_note(dear: dict[str, Any], steps: list[str]) -> dict[str, Any]:
    result = dear["result"]
    final = result.final
    note: dict[str, Any] = {
        "rung": "c",
        "ran": True,
        "steps": steps,
        "tries": len(result.tries) - 1,
        "float_nodes": final.get("float_nodes", 0),
        "measured": {final.get("metric", "score"): round(float(final.get("score", 0.0)), 6)},
        "met": bool(result.met),
        "stop": result.stop,
    }
    if dear["equalized"].get("measured"):
        note["equalize_measured"] = dear["equalized"]["measured"]
    if dear["rounding"].get("measured"):
        note["rounding_measured"] = dear["rounding"]["measured"]
    return note


def _measured_speedup(latency: dict[str, Any]) -> float | None:
    """FP32 p50 over the shipped INT8 model's p50 from a search's own timing; None when either is missing or FP32
    runs under :data:`MIN_MS` (timer noise)."""
    try:
        fp32, int8 = float(latency["fp32"]["p50_ms"]), float(latency["int8_final"]["p50_ms"])
    except (KeyError, TypeError, ValueError):
        return None
    return fp32 / max(int8, 1e-9) if fp32 >= MIN_MS else None


def _better(cheap: Any, dear: Any) -> bool:
    """Whether rung b's (missing) result scored above rung c's (missing) one: then rung b's model is reported."""
    return float(cheap.final.get("score", 0.0)) > float(dear.final.get("score", 0.0))


def _int8_fixes(ctx: BuildContext, tries: Sequence[dict[str, Any]], target: float, *, more_tries: bool) -> str:
    """The fixes that would change a failed INT8 search's outcome, from what stopped its tries: a veto by the
    real-sample goldens (``tolerance.int8``), a score under the held-out target (``accuracy_target``), or too few
    tries to put more layers in float. A lower target is offered only from a try that kept INT8 compute (its
    ``int8_compute``) and was judged on every sample: a lower target met by a try with no INT8 compute, or by a
    score estimated from part of the samples, would fail again."""
    p = ctx.cfg.precision
    fixes = []
    if more_tries:
        fixes.append(f"raise precision.max_fallback_tries (now {p.max_fallback_tries}) so more layers can stay float")
    vetoed = [t for t in tries if "vetoed" in t]
    if vetoed and not any("real sample" in str(t["vetoed"]) for t in vetoed):
        fixes.append(
            "give validate.data with real inputs: with no real-sample golden the spec-random ones judge agreement"
        )
    if vetoed:
        key = "min_topk_agreement" if "top-k" in str(vetoed[-1]["vetoed"]) else "min_cosine"
        fixes.append(
            f"relax [tolerance.int8] {key} if that real-sample agreement is acceptable (it is what validation and "
            "the device check judge)"
        )
    int8 = [t for t in tries if t.get("int8_compute", True)]
    scored = [float(t["score"]) for t in int8 if "vetoed" not in t and "judged_samples" not in t]
    if scored and max(scored) < target:
        fixes.append(
            f"lower precision.accuracy_target to {math.floor(max(scored) * 1000) / 1000:g} (the best try's "
            f"held-out score) if that agreement is acceptable"
        )
    fixes.append("build FP32 (or FP16 on a GPU target)")
    return "; or ".join(fixes)


def _refuse_without_int8_compute(
    ctx: BuildContext, model: Path, result: Any, probe: Any, pinned: dict[str, str], target: float
) -> None:
    """Never an INT8 label on a float model: refuse when ``model`` has no INT8 compute left, naming what kept
    every node float (the accuracy search, the speed probe, ``precision.keep_fp32``).

    Raises:
        NoInt8ComputeError: no QLinear*/integer op and no compute op reading DequantizeLinear outputs.
    """
    from edgedeploy.errors import NoInt8ComputeError
    from edgedeploy.precision import analysis

    if analysis.int8_compute_left(model):
        return
    causes = []
    listed = [n for n, why in pinned.items() if why == "listed in precision.keep_fp32"]
    if listed:
        causes.append(f"{len(listed)} listed in precision.keep_fp32")
    if probe.kept:
        causes.append(f"{len(probe.kept)} faster in float on this CPU (precision.float_when_faster)")
    searched = [n for n in result.excluded if n not in pinned]
    if searched:
        causes.append(f"{len(searched)} for accuracy")
    scores = ", ".join(
        f"{t['float_nodes']} float{' ' + t['family'] if t.get('family') else ''}: {t['score']:.3f}"
        + (" (vetoed)" if "vetoed" in t else "")
        for t in result.tries
    )
    fixes = []
    if searched:  # what stopped the tries with fewer float nodes: the target, or a veto by a real sample
        missed = [t for t in result.tries if not t.get("met")]
        fixes.append(_int8_fixes(ctx, missed, target, more_tries=False))
    if listed:
        fixes.append("list fewer nodes in precision.keep_fp32")
    if probe.kept:
        fixes.append("set precision.float_when_faster = false")
    raise NoInt8ComputeError(
        "precision",
        "INT8 leaves no INT8 compute in this model (every Conv/Gemm/MatMul/LSTM/GRU in float: "
        + (", ".join(causes) or "nothing was quantized: no node of this model is one this target's INT8 takes")
        + f"), i.e. an FP32 model: refusing to call it INT8 (held-out {result.final.get('metric')} by float "
        f"nodes: {scores or 'no tries'})",
        hint="; or ".join(fixes or ["build FP32 (--precision fp32), or FP16 on a GPU target"]),
    )


def _int8_transformer(
    ctx: BuildContext,
    float_model: Path,
    batches: Sequence[Feeds],
    tmp: Path,
    evidence: dict[str, int],
    warnings: list[str],
    accuracy: tuple[float, str],
) -> dict[str, Any]:
    """INT8 of a transformer graph: weight MatMuls only, in the scheme of the target's runtime
    (edgedeploy/precision/transformer.py), judged on held-out calibration batches."""
    from edgedeploy.precision import analysis
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
    accuracy_target, target_why = accuracy  # (value, where it came from)
    from edgedeploy.precision.goldens_veto import golden_cases, goldens_veto

    # one judge, as the CNN path: a candidate the goldens check would fail is vetoed, and validate.data is judged
    goldens = golden_cases(ctx.path(GOLDENS))
    real_data = [feeds for point, feeds, _, _ in goldens if point == "data"] if cfg.validate.data else []

    golden_feeds = [feeds for _, feeds, _, _ in goldens]

    def veto(model: Path, judged: Sequence[Feeds], outputs: Sequence[Feeds]) -> str | None:
        if not goldens:
            return None
        # the goldens' held-out samples are among the judged ones: their outputs are taken, not run again
        known = {c: outputs[e] for c, e in analysis.shared_inputs(golden_feeds, judged).items() if e < len(outputs)}
        return goldens_veto(cfg, model, goldens, known, qdq_as_written=scheme.qdq_as_written)

    import time

    budget = p.time_budget_s  # the transformer INT8 search, from here
    result, plan, q = quantize_transformer(
        float_model, out, tmp, scheme=scheme, batches=batches, classifier_outputs=cfg.validate.classifier_outputs,
        accuracy_target=accuracy_target, max_tries=p.max_fallback_tries, keep_fp32=p.keep_fp32,
        smoothquant_alpha=p.smoothquant_alpha, per_channel=p.per_channel, reduce_range=reduce_range,
        log=(lambda line: ctx.log(f"  {line}")) if ctx.log else None, veto=veto, real_data=real_data,
        deadline=time.monotonic() + budget if budget is not None else None,
    )  # fmt: skip
    if not result.met:
        table = "; ".join(f"try {t['try']}: {t['float_matmuls']} float MatMuls, {t['metric']} {t['score']:.4f}"
                          + (f" ({t['vetoed']})" if "vetoed" in t else "") for t in result.tries)  # fmt: skip
        fixes = ["list layers in precision.keep_fp32"]
        on_time = "time_budget_s" in result.stop
        if not on_time and (p.max_fallback_tries == 0 or result.tries_spent):
            fixes.insert(0, "raise precision.max_fallback_tries")
        if p.smoothquant_alpha == 0:
            fixes.insert(0, "set precision.smoothquant_alpha = 0.5")
        if on_time:  # the search did not run out of ideas: it ran out of the time it was given
            fixes.insert(0, f"raise precision.time_budget_s (now {budget}) or drop it: the search stopped on time")
        raise StageError(
            "precision",
            f"transformer INT8 misses {_target_text(ctx, accuracy_target)} on held-out "
            f"data after {len(result.tries) - 1} fallback tries ({table}"
            + (f"; stopped: {result.stop}" if result.stop else "")
            + ")",
            hint=", or ".join(fixes),
        )
    from edgedeploy.precision.analysis import int8_compute_left

    if not int8_compute_left(out):
        from edgedeploy.errors import NoInt8ComputeError

        raise NoInt8ComputeError(
            "precision",
            f"transformer INT8 leaves no INT8 compute in this model ({len(result.kept_float)} MatMul(s) kept float: "
            + ", ".join(f"{n} ({why})" for n, why in list(result.kept_float.items())[:4])
            + "), i.e. an FP32 model: refusing to call it INT8",
            hint="list fewer nodes in precision.keep_fp32, or build FP32 (--precision fp32)",
        )
    if plan["absurd_ranges"]:
        ctx.log(f"  INT8: {len(plan['absurd_ranges'])} tensor(s) with absurd ranges (masks) kept float")
    sensitive = [n for n, why in result.kept_float.items() if why.startswith("INT8 sensitive")]
    if sensitive:
        warnings.append(f"INT8: {len(sensitive)} MatMul(s) kept in float for accuracy: " + ", ".join(sensitive[:6]))
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
        "accuracy_target": {"value": accuracy_target, "why": target_why},
        "accuracy": result.final,
        "kept_float": [{"node": n, "why": why} for n, why in result.kept_float.items()],
        "fallback_tries": result.tries,
        **({"fallback_stop": result.stop} if result.stop else {}),
        **({"fallback_start": result.start} if result.start else {}),
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


def _fp16(ctx: BuildContext, batches: Sequence[Feeds], tmp: Path, warnings: list[str]) -> dict[str, Any]:
    import onnx

    from edgedeploy.precision import analysis
    from edgedeploy.precision.fp16 import (
        captured_warnings,
        first_nonfinite_layers,
        fp16_strategy,
        mixed_fp16,
        single_float_output_nodes,
    )

    cfg, target = ctx.cfg, ctx.target
    model_path = ctx.path(ONNX_MODEL)
    proto = onnx.load(str(model_path))
    analysis.check_node_names(cfg.precision.keep_fp32, proto, "precision.keep_fp32")
    strategy = fp16_strategy(target.strongly_typed_only)
    with captured_warnings() as library_warnings:
        findings = analysis.fp16_findings(analysis.tensor_ranges(model_path, batches, tmp), proto)
        pins = {n: "listed in precision.keep_fp32" for n in cfg.precision.keep_fp32}
        pins.update({n: why for n, why in analysis.fp16_pins(findings).items() if n not in pins})
        # Host check: FP32 graph rounding every FP16 layer's weights and outputs to FP16 (what the GPU stores),
        # pinned layers exact. Used for both routes; TensorRT <= 10 never gets an FP16 ONNX file.
        sim = (ctx.staging if strategy == "builder-flag" else tmp) / FP16_SIMULATED
        conversion = mixed_fp16(model_path, sim, keep_fp32=list(pins), simulate=True)
        reference = analysis.run_model(model_path, batches)
        outputs = analysis.run_model(sim, batches)
        if strategy == "typed-onnx":
            typed = ctx.staging / deploy_model_name("fp16")
            mixed_fp16(model_path, typed, keep_fp32=list(pins))
            typed_out = analysis.run_model(typed, batches[:1])  # it must load and run in ONNX Runtime
            if not all(np.isfinite(v).all() for o in typed_out for v in o.values() if v.dtype.kind == "f"):
                outputs = typed_out  # reported below as non-finite
    for f in findings:
        if f["issue"] == "underflow":
            warnings.append(f"FP16 underflow in {f['tensor']} ({f['producer']}): {f['why']}")
    if pins:
        warnings.append(f"FP16: {len(pins)} node(s) pinned to FP32: " + ", ".join(list(pins)[:6]))
    nonfinite = sorted({n for o in outputs for n, v in o.items() if v.dtype.kind == "f" and not np.isfinite(v).all()})
    if nonfinite:
        culprits = first_nonfinite_layers(sim, batches[:1], tmp)
        raise StageError(
            "precision",
            f"FP16 gives NaN/Inf in {', '.join(nonfinite)} after pinning {len(pins)} node(s) to FP32"
            + (f"; first non-finite layer(s): {', '.join(culprits)}" if culprits else ""),
            hint=(f"add {', '.join(repr(c) for c in culprits)} to precision.keep_fp32" if culprits else None)
            or "build in FP32 (--precision fp32): no layer was found to pin",
        )
    check = analysis.accuracy(reference, outputs, cfg.validate.classifier_outputs)
    from edgedeploy.precision.goldens_veto import golden_cases, goldens_veto

    # the one judge: the model the bundle's dry run runs (the simulation, or the FP16-typed model) on the goldens
    # validation and the device compare with, at tolerance.fp16; a build never passes what that run then fails
    dry_run = ctx.staging / deploy_model_name("fp16") if strategy == "typed-onnx" else sim
    goldens = golden_cases(ctx.path(GOLDENS))
    veto = goldens_veto(cfg, dry_run, goldens, precision="fp16") if goldens else None
    if veto is None and goldens and dry_run != sim:
        # the FP16-typed model on ONNX Runtime's CPU provider, which drops Cast pairs (an input's rounding among
        # them): the simulation stores what the GPU stores, and must pass the same goldens
        veto = goldens_veto(cfg, sim, goldens, precision="fp16")
    if veto:
        raise StageError(
            "precision",
            f"FP16 would fail the goldens check that validation and the bundle's dry run run: {veto} (host check "
            f"{check['metric']} {check['score']:.4f}, {len(pins)} node(s) pinned to FP32)",
            hint="name the layers that lose precision in precision.keep_fp32 (precision.json lists fp16_findings), "
            "or build FP32 (--precision fp32)",
        )
    fp16_target, _ = _accuracy_target(ctx, proto)
    if check["score"] < fp16_target:
        warnings.append(
            f"FP16 host check: {check['metric']} {check['score']:.4f} < {_target_text(ctx, fp16_target)} "
            "(FP16 rounding simulated in ONNX Runtime; the device's kernels differ)"
        )
    if library_warnings:
        warnings.append(
            f"FP16: {len(library_warnings)} library warning(s) captured in precision.json (library_warnings)"
        )
    typed_outputs = single_float_output_nodes(proto, list(pins))
    return {
        "strategy": strategy,
        "onnx_dtype": "float16" if strategy == "typed-onnx" else "float32",
        "onnx": deploy_model_name("fp16") if strategy == "typed-onnx" else ONNX_MODEL,
        "fp32_layers": [{"node": n, "why": why, "pin_output_type": n in typed_outputs} for n, why in pins.items()],
        "fp16_findings": findings,
        "host_check": {**check, "how": "FP16 rounding of weights and layer outputs simulated in ONNX Runtime CPU"},
        "simulated_onnx": FP16_SIMULATED if strategy == "builder-flag" else None,
        "conversion": {k: v for k, v in conversion.items() if k != "fp32_nodes"},
        "library_warnings": library_warnings,
    }
