"""INT8 by explicit quantization: a QDQ ONNX model from onnxruntime.quantization.quantize_static, calibrated once
on the user's data, with automatic FP32 fallback of the most sensitive layers until the accuracy target is met.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.errors import StageError
from edgedeploy.precision import analysis
from edgedeploy.precision.data import OrtCalibrationReader


@dataclass(frozen=True)
class QdqFlavour:
    """How activations and weights are quantized for one runtime.

    Attributes:
        name: the usual short name (activation / weight signedness).
        activation_type / weight_type: ``onnxruntime.quantization.QuantType`` member names.
        activation_symmetric: symmetric activation ranges (zero point 0).
        quantize_bias: int32 biases (ONNX Runtime's integer kernels) or float biases (TensorRT refuses int32 DQ).
        why: the reason this runtime wants this flavour (goes into the report).
        reduce_range: 7-bit weights (ORT's ``reduce_range``). x86 without VNNI multiplies uint8 x int8 with
            ``vpmaddubsw``, whose int16 sum of two products saturates with full 8-bit weights.
    """

    name: str
    activation_type: str
    weight_type: str
    activation_symmetric: bool
    quantize_bias: bool
    why: str
    reduce_range: bool = False


QDQ_FLAVOURS: dict[str, QdqFlavour] = {
    "tensorrt": QdqFlavour(
        "S8S8", "QInt8", "QInt8", True, False, "TensorRT reads symmetric signed INT8 Q/DQ (zero point 0), float bias"
    ),
    "onnxruntime": QdqFlavour(
        "U8S8",
        "QUInt8",
        "QInt8",
        False,
        True,
        "x86 ONNX Runtime's fast INT8 kernels take uint8 activations; 7-bit weights (reduce_range) avoid their "
        "int16 saturation on CPUs without VNNI",
        reduce_range=True,
    ),
}

CALIB_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}


def flavour_for(runtime: str) -> QdqFlavour:
    """The QDQ flavour the target's runtime needs (as its registered backend names it).

    Raises:
        ConfigError: the runtime is not registered.
    """
    from edgedeploy import runtimes

    return QDQ_FLAVOURS[runtimes.get(runtime).qdq_flavour]


@dataclass
class Quantizer:
    """Quantizes one float model repeatedly (different exclusions) from a single calibration pass.

    The first :meth:`quantize` calibrates and saves ORT's range cache (JSON) in ``workdir``; later calls
    reuse it, so a fallback try costs one quantization, not one calibration.
    """

    float_model: Path
    workdir: Path
    flavour: QdqFlavour
    method: str = "minmax"
    per_channel: bool = True
    _ranges_json: Path = field(init=False)

    def __post_init__(self) -> None:
        self._ranges_json = self.workdir / "ort_ranges.json"

    def quantize(
        self,
        out: Path,
        batches: Sequence[dict[str, np.ndarray]],
        exclude: Sequence[str] = (),
        only: Sequence[str] | None = None,
    ) -> Path:
        """Write a QDQ model of ``float_model`` to ``out`` with ``exclude`` nodes left in float
        (``only``: quantize just these nodes).

        Raises:
            StageError: onnxruntime.quantization fails (message names the cause).
        """
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        reader = None if self._ranges_json.is_file() else OrtCalibrationReader(batches)
        extra = {
            "ActivationSymmetric": self.flavour.activation_symmetric,
            "WeightSymmetric": True,
            "QuantizeBias": self.flavour.quantize_bias,
        }
        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)  # ORT logs advice (pre-processing) through the root logger
        try:
            quantize_static(
                str(self.float_model),
                str(out),
                calibration_data_reader=reader,
                quant_format=QuantFormat.QDQ,
                per_channel=self.per_channel,
                reduce_range=self.flavour.reduce_range,
                activation_type=getattr(QuantType, self.flavour.activation_type),
                weight_type=getattr(QuantType, self.flavour.weight_type),
                nodes_to_quantize=list(only) if only is not None else None,
                nodes_to_exclude=list(exclude),
                calibrate_method=getattr(CalibrationMethod, CALIB_METHODS[self.method]),
                extra_options=extra,
                calibration_cache_path=str(self._ranges_json),
            )
        except Exception as exc:  # onnxruntime.quantization raises assorted exception types
            raise StageError(
                "precision",
                f"INT8 quantization failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
                hint="try precision.calib_method = 'minmax' or list the failing node in precision.keep_fp32",
            ) from None
        finally:
            logging.getLogger().setLevel(quiet)
        return out

    def ranges(self) -> dict[str, tuple[float, float]]:
        """Tensor name -> (lo, hi) activation range from the calibration (after :meth:`quantize` ran once)."""
        from onnxruntime.quantization.calibrate import load_tensors_data

        data = load_tensors_data(self._ranges_json)
        out = {}
        for name in data:
            lo, hi = data[name].range_value
            out[name] = (float(np.asarray(lo).min()), float(np.asarray(hi).max()))
        return out


def preprocess(model_path: Path, out: Path) -> Path:
    """ONNX Runtime's recommended pre-quantization step (shape inference, basic graph optimizations).

    Falls back to a plain copy when the optimizer cannot handle the model (the quantizer still works).
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(model_path), str(out), skip_symbolic_shape=True)
    except Exception:  # pre-processing is an optimization; quantizing the raw export is still correct
        shutil.copyfile(model_path, out)
    return out


@dataclass
class FallbackResult:
    """The outcome of INT8 quantization with fallback (all plain data for precision.json)."""

    model: Path
    excluded: dict[str, str]  # node -> why it stayed in float
    tries: list[dict[str, Any]]
    sensitivity: list[dict[str, Any]]
    met: bool
    target: float
    latency: dict[str, Any]


def layer_sensitivity(
    q: Quantizer,
    batches: Sequence[dict[str, np.ndarray]],
    reference: Sequence[dict[str, np.ndarray]],
    candidates: Sequence[str],
) -> list[dict[str, Any]]:
    """Per-layer INT8 sensitivity: the model's output error when only that node is quantized (most sensitive first).

    Quantizing one node at a time isolates what its input / weight / output quantization alone costs at the
    model outputs, so an outlier-dominated tensor that looks harmless in a norm shows up where it hurts.
    """
    import onnx

    ops = {n.name: n.op_type for n in onnx.load(str(q.float_model)).graph.node}
    rows = []
    for i, node in enumerate(candidates):
        model = q.quantize(q.workdir / f"only{i}.int8.onnx", batches, only=[node])
        err = analysis.output_error(reference, analysis.run_model(model, batches))
        rows.append({"node": node, "op": ops.get(node, ""), "output_error": err})
        model.unlink(missing_ok=True)
    rows.sort(key=lambda r: r["output_error"], reverse=True)
    return rows


def quantize_with_fallback(
    q: Quantizer,
    *,
    out: Path,
    batches: Sequence[dict[str, np.ndarray]],
    classifier_outputs: Sequence[str],
    accuracy_target: float,
    max_tries: int,
    keep_fp32: Sequence[str] = (),
    latency_feeds: dict[str, np.ndarray] | None = None,
    latency_iters: int = 10,
    log: Callable[[str], None] | None = None,
) -> FallbackResult:
    """Quantize everything, then exclude the most sensitive nodes until ``accuracy_target`` is met.

    The score is top-1 agreement (classifier outputs) or cosine similarity against the FP32 ONNX model on
    ``batches``. Sensitivity (:func:`layer_sensitivity`) is measured once, over the nodes the naive model
    quantized; try ``t`` excludes the top ``2**(t-1)`` nodes, for at most ``max_tries`` tries. Latency of
    the naive and the final model is measured in ONNX Runtime when ``latency_feeds`` is given.

    Returns the result whether or not the target was met (``met``); the caller decides to fail.
    ``log`` gets one progress line per step (sensitivity over many nodes takes a while).
    """
    say = log or (lambda _line: None)
    reference = analysis.run_model(q.float_model, batches)
    pinned = {n: "listed in precision.keep_fp32" for n in keep_fp32}
    naive = q.quantize(q.workdir / "naive.int8.onnx", batches, exclude=list(pinned))
    score = analysis.accuracy(reference, analysis.run_model(naive, batches), classifier_outputs)
    tries = [{"try": 0, "excluded": list(pinned), "score": score["score"], "metric": score["metric"]}]
    chosen, excluded, sensitivity = naive, dict(pinned), []
    if score["score"] < accuracy_target and max_tries > 0:
        import onnx

        candidates = [n for n in analysis.quantized_nodes(onnx.load(str(naive))) if n not in pinned]
        say(
            f"INT8 {score['metric']} {score['score']:.4f} < target {accuracy_target}: "
            f"measuring the sensitivity of {len(candidates)} quantized nodes"
        )
        sensitivity = layer_sensitivity(q, batches[:4], reference[:4], candidates)
        for t in range(1, max_tries + 1):
            top = sensitivity[: 2 ** (t - 1)]
            if not top:
                break
            trial_excl = {
                **pinned,
                **{
                    r["node"]: f"INT8 sensitive: quantizing this {r['op']} alone gives {r['output_error']:.3g} "
                    "relative output error"
                    for r in top
                },
            }
            model = q.quantize(q.workdir / f"try{t}.int8.onnx", batches, exclude=list(trial_excl))
            score = analysis.accuracy(reference, analysis.run_model(model, batches), classifier_outputs)
            tries.append({"try": t, "excluded": list(trial_excl), "score": score["score"], "metric": score["metric"]})
            say(f"INT8 fallback try {t}: {len(trial_excl)} node(s) in float, {score['metric']} {score['score']:.4f}")
            chosen, excluded = model, trial_excl
            if score["score"] >= accuracy_target or len(top) == len(sensitivity):
                break
    shutil.copyfile(chosen, out)
    lat: dict[str, Any] = {"status": "skipped", "reason": "no latency feeds"}
    if latency_feeds is not None:
        lat = {
            "fp32": analysis.measure_latency(q.float_model, latency_feeds, warmup=2, iters=latency_iters),
            "int8_naive": analysis.measure_latency(naive, latency_feeds, warmup=2, iters=latency_iters),
        }
        if chosen != naive:
            lat["int8_final"] = analysis.measure_latency(chosen, latency_feeds, warmup=2, iters=latency_iters)
        else:
            lat["int8_final"] = lat["int8_naive"]
        lat["fallback_cost"] = lat["int8_final"]["p50_ms"] / max(lat["int8_naive"]["p50_ms"], 1e-9)
    return FallbackResult(
        model=out,
        excluded=excluded,
        tries=tries,
        sensitivity=sensitivity[:20],
        met=tries[-1]["score"] >= accuracy_target,
        target=accuracy_target,
        latency=lat,
    )
