"""INT8 by explicit quantization: a QDQ ONNX model from onnxruntime.quantization.quantize_static, calibrated once
on the user's data, with automatic FP32 fallback of the most sensitive layers until the accuracy target is met.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.config import CalibMethod
from edgedeploy.errors import StageError


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
        host_cpu_kernels: the artifact's INT8 kernels are this host's CPU kernels (ONNX Runtime), so the
            CPU's VNNI/AMX flags decide the weight width; else (TensorRT) 8-bit weights.
    """

    name: str
    activation_type: str
    weight_type: str
    activation_symmetric: bool
    quantize_bias: bool
    why: str
    reduce_range: bool = False
    host_cpu_kernels: bool = False
    # Q/DQ placed for TensorRT's fusions (precision/qdq_placement.py): pooling and head float, no pair on
    # conv->activation edges, only the skip input of a residual Add quantized
    tensorrt_placement: bool = False

    @property
    def qdq_as_written(self) -> bool:
        """ONNX Runtime only stands in for the target's INT8 kernels (TensorRT): every session of this
        flavour's Q/DQ models runs the graph as its operators define it (``ort_session(qdq_as_written=True)``),
        the precision stage's judge and the bundle's dry run alike."""
        return not self.host_cpu_kernels


QDQ_FLAVOURS: dict[str, QdqFlavour] = {
    "tensorrt": QdqFlavour(
        "S8S8",
        "QInt8",
        "QInt8",
        True,
        False,
        "TensorRT reads symmetric signed INT8 Q/DQ (zero point 0), float bias; Q/DQ placed for "
        "its conv+activation and conv+residual-add fusions",
        tensorrt_placement=True,
    ),
    "onnxruntime": QdqFlavour(
        "U8S8",
        "QUInt8",
        "QInt8",
        False,
        True,
        "x86 ONNX Runtime's fast INT8 kernels take uint8 activations; 8-bit weights where the CPU has VNNI/AMX, "
        "7-bit (reduce_range) only where measured to agree better (int16 saturation of vpmaddubsw without VNNI)",
        host_cpu_kernels=True,
    ),
}

CALIB_METHODS = ("minmax", "entropy", "percentile", "mse")  # ranges chosen by edgedeploy.precision.histogram


def calib_method_for(
    setting: CalibMethod, outputs: Sequence[str], classifier_outputs: Sequence[str]
) -> tuple[CalibMethod, str]:
    """(method, why): ``setting`` unless it is ``auto``; then ``mse`` when every output is a classifier output
    (a clipped outlier rarely moves an argmax; on EfficientNet-Lite0 mse was ahead of minmax in 23 of 24 measured
    pairs), else ``minmax`` (embeddings and regressions carry every activation's size: on a ResNet-50 embedder
    mse's clipping cost the never-calibrated photos' worst cosine 0.94 -> 0.76)."""
    if setting != "auto":
        return setting, "precision.calib_method"
    if outputs and all(o in classifier_outputs for o in outputs):
        return "mse", "auto: every output is a classifier output (validate.classifier_outputs)"
    return "minmax", "auto: not every output is a classifier output, so no activation range is clipped"


def flavour_for(runtime: str) -> QdqFlavour:
    """The QDQ flavour the target's runtime needs (as its registered backend names it).

    Raises:
        ConfigError: the runtime is not registered.
    """
    from edgedeploy import runtimes

    return QDQ_FLAVOURS[runtimes.get(runtime).qdq_flavour]


VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_int8_flags(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The VNNI / AMX flags of this CPU from ``/proc/cpuinfo`` (empty off Linux or without them).

    With any of them, ONNX Runtime's U8S8 kernels multiply with ``vpdpbusd`` / AMX tiles, which accumulate
    in int32: full 8-bit weights cannot saturate, so 7-bit weights only lose precision.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ()
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[-1].split())
    return tuple(f for f in VNNI_FLAGS if f in flags)


def reduce_range_choices(setting: bool | str, runtime: str, cpu_flags: Sequence[str]) -> tuple[list[bool], str]:
    """Which weight widths to try for ``precision.reduce_range`` (``"auto"``, true, false) and why.

    ``auto``: 8-bit weights on TensorRT and on CPUs with VNNI/AMX; on x86 without them both 8-bit and 7-bit
    are quantized and the one that agrees better on the held-out data is kept (measured, not assumed).
    """
    if isinstance(setting, bool):
        return [setting], f"precision.reduce_range = {str(setting).lower()}"
    if not flavour_for(runtime).host_cpu_kernels:
        return [False], f"{runtime}: 8-bit weights (its INT8 kernels are not this CPU's)"
    if cpu_flags:
        return [False], f"8-bit weights: this CPU has {', '.join(cpu_flags)} (int32 accumulation, no saturation)"
    return [False, True], "no VNNI/AMX on this CPU: 8-bit and 7-bit weights measured, the better one kept"


@contextmanager
def ort_quantization(what: str, hint: str) -> Iterator[None]:
    """Run onnxruntime.quantization quietly and turn its failures into one StageError.

    Raises:
        StageError: the quantizer raised; the message names ``what`` failed and why.
    """
    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # ORT logs advice (pre-processing) through the root logger
    try:
        yield
    except Exception as exc:  # onnxruntime.quantization raises assorted exception types
        raise StageError(
            "precision", f"{what} failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", hint=hint
        ) from None
    finally:
        logging.getLogger().setLevel(quiet)


RANGES = "ort_ranges.json"  # the calibration's ranges in a quantizer's workdir (ORT's cache format)


@dataclass
class Quantizer:
    """Quantizes one float model repeatedly (different exclusions) from a single calibration pass.

    The first :meth:`quantize` calibrates and saves ORT's range cache (JSON) in ``workdir``; later calls
    reuse it, so a fallback try costs one quantization, not one calibration. The first model onnxruntime
    quantizes with given settings is kept there too: a later call whose float nodes include its float nodes is
    made from it by graph surgery (:mod:`edgedeploy.precision.float_subset`), not quantized again.
    """

    float_model: Path
    workdir: Path
    flavour: QdqFlavour
    method: str = "minmax"  # the stage passes precision.calib_method, resolved by calib_method_for
    per_channel: bool = True
    reduce_range: bool | None = None  # None: the flavour's default
    # conv node -> per-channel float input mean: bias correction of every quantized conv (precision/equalize.py)
    bias_means: dict[str, np.ndarray] | None = None
    # layer-by-layer output-mean correction (precision/bias_correction.py), measured for each set of float nodes
    output_bias_correction: bool = False
    output_shifts: dict[str, np.ndarray] | None = None
    output_shifts_for: tuple[str, ...] | None = None  # the sorted exclusions the shifts were measured with
    # the float model's conv output means on the calibration batches bias correction measures on, taken by the
    # calibration pass (empty when the ranges came from elsewhere: bias correction then runs the float model)
    float_conv_means: dict[str, np.ndarray] = field(default_factory=dict)
    # learned weight rounding (precision/adaround.py): integer codes written over ORT's nearest rounding
    weight_codes: Any = None  # adaround.RoundingResult
    float_outputs: bool = True  # graph outputs written in float by the last layer (precision/float_outputs.py)
    placement: dict[str, Any] = field(default_factory=dict)  # what the TensorRT placement changed (last model)
    _ranges_json: Path = field(init=False)
    # the float model's parses the rewrites read (precision/model_files.py): once per quantizer, not per model
    _read_cache: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)
    # the very arrays float_conv_means were taken on (held, so no other array can pass for them)
    _conv_means_on: tuple[np.ndarray, ...] = field(default=(), init=False)
    _float_for_runtime: dict[str, str] | None = field(default=None, init=False)
    # per folder: the float model's weights written once, referenced by the one-node models saved there
    _shared_weights: dict[Path, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._ranges_json = self.workdir / RANGES

    def adopt_ranges(self, workdir: Path) -> None:
        """Reuse the ranges another quantizer of the same float model and batches chose (in ``workdir``): one
        calibration, not two."""
        if not self._ranges_json.is_file() and (workdir / self._ranges_json.name).is_file():
            shutil.copyfile(workdir / self._ranges_json.name, self._ranges_json)

    def calibrate(self, batches: Sequence[dict[str, np.ndarray]]) -> None:
        """Observe every tensor on ``batches`` and store the ranges ``method`` picks (once; later calls reuse them).

        The histograms are ours (:mod:`edgedeploy.precision.histogram`): onnxruntime's entropy calibrator
        collapses to min/max on real CNNs, so the three methods would otherwise give the same model.
        """
        from edgedeploy.precision import histogram

        if self._ranges_json.is_file():
            return
        import onnx

        proto = onnx.load(str(self.float_model), load_external_data=False)
        conv_means = None
        if self.output_bias_correction:  # bias correction's float means from this pass: no float run of its own
            from edgedeploy.precision.bias_correction import FloatConvMeans

            conv_means = FloatConvMeans(proto, batches)
        observe = conv_means.observe if conv_means is not None else None
        hists = histogram.collect(self.float_model, batches, self.workdir, observe=observe)
        if conv_means is not None:
            self.float_conv_means = conv_means.means()
            self._conv_means_on = _head_arrays(batches, conv_means.batches)
        outputs = [o.name for o in proto.graph.output]
        from edgedeploy.precision.equalize import tie_clip_ranges

        symmetric = self.flavour.activation_symmetric
        ranges = tie_clip_ranges(histogram.choose_ranges(hists, self.method, exact=outputs, symmetric=symmetric))
        histogram.write_ort_cache(ranges, self._ranges_json)

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
        self.calibrate(batches)
        if self.flavour.tensorrt_placement and only is None:
            exclude = [*exclude, *(n for n in self.float_for_runtime() if n not in exclude)]
        reduce_range = self.flavour.reduce_range if self.reduce_range is None else self.reduce_range
        extra = {
            "ActivationSymmetric": self.flavour.activation_symmetric,
            "WeightSymmetric": True,
            "QuantizeBias": self.flavour.quantize_bias,
        }
        base = self._base_model(reduce_range)
        from edgedeploy.precision import model_files

        # the rewrites below share one parse of the model and write it once (precision/model_files.py)
        with model_files.held(out, self._read_cache):
            self._write(out, base, batches, exclude, only, reduce_range, extra)
        return out

    def _write(
        self,
        out: Path,
        base: tuple[Path, Path],
        batches: Sequence[dict[str, np.ndarray]],
        exclude: Sequence[str],
        only: Sequence[str] | None,
        reduce_range: bool,
        extra: dict[str, Any],
    ) -> None:
        """:meth:`quantize`'s model and its rewrites, inside its :func:`model_files.held` block.

        Raises:
            StageError: onnxruntime.quantization fails (message names the cause).
        """
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        if not self._derive(base, out, exclude, only):
            with ort_quantization("INT8 quantization", "list the node named in the message in precision.keep_fp32"):
                quantize_static(
                    str(self.float_model),
                    str(out),
                    calibration_data_reader=None,
                    quant_format=QuantFormat.QDQ,
                    per_channel=self.per_channel,
                    reduce_range=reduce_range,
                    activation_type=getattr(QuantType, self.flavour.activation_type),
                    weight_type=getattr(QuantType, self.flavour.weight_type),
                    nodes_to_quantize=list(only) if only is not None else None,
                    nodes_to_exclude=list(exclude),
                    calibrate_method=CalibrationMethod.MinMax,  # the cache holds the ranges our method chose
                    extra_options=extra,
                    calibration_cache_path=str(self._ranges_json),
                )
            if only is None and not base[0].is_file():  # the first model: later float sets are made from it
                shutil.copyfile(out, base[0])
                base[1].write_text(json.dumps(sorted(exclude)))
        bypass_qdq_into_float_nodes(out, self.float_model)
        if self.flavour.tensorrt_placement:  # before the corrections below: they measure the placed graph
            from edgedeploy.precision.qdq_placement import place_for_tensorrt

            self.placement = place_for_tensorrt(out, self.float_for_runtime()).to_dict()
        if self.float_outputs:  # a classifier's near-tie logits would otherwise share one INT8 code
            from edgedeploy.precision.float_outputs import float_graph_outputs

            float_graph_outputs(out)
        if self.weight_codes is not None:  # before bias correction: it measures the rounded model
            from edgedeploy.precision.adaround import apply_codes

            apply_codes(out, self.weight_codes)
        from edgedeploy.precision.equalize import correct_bias, integer_clip_bounds

        if self.bias_means:
            correct_bias(out, self.float_model, self.bias_means)
        if self.output_bias_correction and only is None:
            from edgedeploy.precision.bias_correction import apply_bias_shifts, output_mean_shifts

            # measured per float set: keeping early layers float changes every later conv's mean shift, so
            # shifts measured on the all-INT8 model would over-correct a fallback try
            key = tuple(sorted(exclude))
            if self.output_shifts is None or self.output_shifts_for != key:
                self.output_shifts = output_mean_shifts(
                    out,
                    self.float_model,
                    batches,
                    qdq_as_written=self.flavour.qdq_as_written,
                    # measured by the calibration pass on these very arrays, else measured again
                    float_means=self.float_conv_means
                    if _same_objects(self._conv_means_on, _head_arrays(batches))
                    else None,
                )
                self.output_shifts_for = key
            apply_bias_shifts(out, self.output_shifts)
        if self.flavour.name == "U8S8":  # onnxruntime: CLE's per-channel ReLU6 bound on the integers
            integer_clip_bounds(out)
        drop_unread_initializers(out)
        if only is not None:  # a ranking model, run once: its float weights referenced, not copied
            self._reference_float_weights(out)

    def _reference_float_weights(self, out: Path) -> None:
        """The model at ``out`` (held) with its float weights referenced in the float model's weights file beside it,
        not copied (:mod:`edgedeploy.precision.shared_weights`): a one-node model of the ranking, run once."""
        from edgedeploy.precision import model_files
        from edgedeploy.precision.shared_weights import SharedWeights

        folder = out.parent.resolve()
        if folder not in self._shared_weights:
            self._shared_weights[folder] = SharedWeights(model_files.read_only(self.float_model), folder)
        model = model_files.load(out)
        if self._shared_weights[folder].externalize(model):
            model_files.save(model, out)

    def _base_model(self, reduce_range: bool) -> tuple[Path, Path]:
        """Where the first quantizer output of these settings (float model, ranges, weight width, per-channel,
        flavour) and its float nodes are kept in ``workdir``: (model, its float node list as JSON)."""
        import hashlib

        stat = self.float_model.stat()
        settings = (
            str(self.float_model.resolve()), stat.st_size, stat.st_mtime_ns, repr(self.flavour),
            self.per_channel, reduce_range, hashlib.sha256(self._ranges_json.read_bytes()).hexdigest(),
        )  # fmt: skip
        key = hashlib.sha256(repr(settings).encode()).hexdigest()[:16]
        return self.workdir / f"quantized_first.{key}.onnx", self.workdir / f"quantized_first.{key}.json"

    def _derive(
        self, base: tuple[Path, Path], out: Path, exclude: Sequence[str], only: Sequence[str] | None = None
    ) -> bool:
        """Write to ``out`` the model with ``exclude`` float (or only ``only`` quantized), made from the first
        model quantized with these settings by graph surgery (:mod:`edgedeploy.precision.float_subset`: no
        weight is quantized again), when that model's float nodes are among ``exclude`` (or ``only`` are among
        its quantized ones). False: nothing written, the quantizer must make it."""
        if not base[0].is_file():
            return False
        first = set(json.loads(base[1].read_text()))
        import onnx

        from edgedeploy.precision import analysis, float_subset, model_files

        proto = onnx.load(str(base[0]))
        if only is not None:  # every quantized node of the first model but ``only`` goes float
            quantized = analysis.quantized_nodes(proto)
            if not set(only) <= set(quantized):
                return False
            exclude = [*first, *exclude, *(n for n in quantized if n not in set(only))]
        if not first <= set(exclude):
            return False
        extra = set(exclude) - first
        if not float_subset.derivable(proto, extra):
            return False
        if extra:
            float_subset.keep_float(proto, model_files.read_only(self.float_model), extra)
            model_files.save(proto, out)
        else:
            shutil.copyfile(base[0], out)
        return True

    def float_for_runtime(self) -> dict[str, str]:
        """Nodes the runtime runs float whatever the accuracy (TensorRT: global pooling, classifier head)."""
        if not self.flavour.tensorrt_placement:
            return {}
        if self._float_for_runtime is None:
            import onnx

            from edgedeploy.precision.qdq_placement import float_nodes_for_tensorrt

            model = onnx.load(str(self.float_model), load_external_data=False)
            self._float_for_runtime = float_nodes_for_tensorrt(model)
        return self._float_for_runtime

    def ranges(self) -> dict[str, tuple[float, float]]:
        """Tensor name -> (lo, hi) activation range from the calibration (after :meth:`quantize` ran once)."""
        from onnxruntime.quantization.calibrate import load_tensors_data

        data = load_tensors_data(self._ranges_json)
        out = {}
        for name in data:
            lo, hi = data[name].range_value
            out[name] = (float(np.asarray(lo).min()), float(np.asarray(hi).max()))
        return out


WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def _head_arrays(batches: Sequence[dict[str, np.ndarray]], count: int | None = None) -> tuple[np.ndarray, ...]:
    """The arrays of the first ``count`` batches (default: the ones bias correction measures on)."""
    from edgedeploy.precision.bias_correction import SAMPLES

    head = list(batches)[: SAMPLES if count is None else count]
    return tuple(v for b in head for _, v in sorted(b.items()))


def _same_objects(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def drop_unread_initializers(path: Path) -> list[str]:
    """Remove the initializers of the model at ``path`` that no node reads (the scales and zero points of the
    Q/DQ pairs the placement, the float outputs and the float fallback took out): ONNX Runtime warns about
    each on every load. Returns their names (the file is rewritten only when there are any)."""
    from edgedeploy.precision import model_files
    from edgedeploy.precision.float_subset import drop_unread_initializers_of

    model = model_files.load(path)
    unread = drop_unread_initializers_of(model.graph)
    if unread:
        model_files.save(model, path)
    return unread


def bypass_qdq_into_float_nodes(path: Path, float_model: Path) -> int:
    """Feed every float Conv/Gemm/MatMul the float tensor itself instead of a DequantizeLinear output.

    ONNX Runtime's ``WeightBiasQuantization`` graph transformer (on at every optimization level above
    "disable all") quantizes the float weights of any such node whose input comes from a DequantizeLinear,
    per tensor. A node kept in float for accuracy would be silently re-quantized when the artifact is loaded:
    on EfficientNet-Lite0 keeping the 16 depthwise convs in float *lowered* top-1 agreement from 85 % to 50 %.
    Reading the unquantized tensor (the QuantizeLinear's input) keeps the node float, and exact. Where the
    quantizer folded a Relu/Clip into that QuantizeLinear's range, the activation (from ``float_model``) is
    re-inserted for the float reader.

    Returns the number of inputs rewired (the model at ``path`` is rewritten only when there are any).
    """
    from edgedeploy.precision import model_files
    from edgedeploy.precision.float_subset import reapplied_activation

    model = model_files.load(path)
    graph = model.graph
    original = model_files.read_only(float_model)
    float_producers = {o: n for n in original.graph.node for o in n.output}
    float_inits = {i.name: i for i in original.graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    have = {i.name for i in graph.initializer}
    dq_outputs = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    new_nodes: list[Any] = []
    restored: dict[str, str] = {}
    rewired = 0
    for node in graph.node:
        if node.op_type in WEIGHTED_OPS and node.input and node.input[0] in dq_outputs:
            weights_dq = len(node.input) > 1 and node.input[1] in dq_outputs
            q = producers.get(producers[node.input[0]].input[0])
            if not weights_dq and q is not None and q.op_type == "QuantizeLinear":
                x = q.input[0]
                act = float_producers.get(x)
                now = producers.get(x)
                if act is not None and now is not None and act.op_type != now.op_type:  # activation folded into Q
                    if x not in restored:
                        copy = reapplied_activation(act, x)
                        restored[x] = copy.output[0]
                        for extra in copy.input[1:]:
                            if extra and extra not in have and extra in float_inits:
                                graph.initializer.append(float_inits[extra])
                                have.add(extra)
                        new_nodes.append(copy)
                    x = restored[x]
                node.input[0] = x
                rewired += 1
        new_nodes.append(node)
    if rewired:
        used = {i for n in new_nodes for i in n.input} | {o.name for o in graph.output}
        keep = [n for n in new_nodes if n.op_type != "DequantizeLinear" or n.output[0] in used]
        del graph.node[:]
        graph.node.extend(keep)
        model_files.save(model, path)
    return rewired


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
