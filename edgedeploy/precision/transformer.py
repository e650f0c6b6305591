"""INT8 for transformer graphs: quantize the weight MatMuls / Gemms, keep softmax, LayerNorm, GELU and mask
arithmetic in float.

Quantizing a transformer like a CNN (every op, static ranges) breaks it: attention masks carry -1e9 / finfo.min
constants whose INT8 scale is ~1e36, softmax and LayerNorm outputs lose their small values, and a single
calibrated range cannot follow activations that change with every sentence. What works (and what the field
ships) is INT8 where the FLOPs are, the MatMuls with constant weights, per-channel symmetric int8 weights:

- **onnxruntime** (cpu): dynamic quantization (``onnxruntime.quantization.quantize_dynamic``): activations are
  quantized per call from their actual range (``DynamicQuantizeLinear`` + ``MatMulInteger``, fused by ORT into
  ``DynamicQuantizeMatMul``), so no calibrated activation range can be wrong;
- **tensorrt**: static Q/DQ on the MatMul inputs and weights only (S8S8, symmetric, calibrated); TensorRT has
  no dynamic INT8, and runs everything without Q/DQ in float.

Which one a target gets is data (:data:`TRANSFORMER_SCHEMES`, keyed by its runtime's Q/DQ flavour). Options:
SmoothQuant-style smoothing (Xiao et al. 2023: divide each activation channel by ``s_j = max|X_j|^a /
max|W_j|^(1-a)`` and multiply the weight rows by it, so outlier channels stop dominating the activation scale),
and automatic FP32 fallback of the most sensitive MatMuls until the held-out score meets the target.
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from edgedeploy.errors import StageError
from edgedeploy.precision import ranges as rng
from edgedeploy.precision.heldout import held_out_until_decided
from edgedeploy.precision.quantize import ort_quantization

# (candidate model, the held-out batches it was judged on, its outputs on them) -> why it fails the goldens, or None
Veto = Callable[[Path, Sequence[dict[str, np.ndarray]], Sequence[dict[str, np.ndarray]]], str | None]

if TYPE_CHECKING:
    from onnx import ModelProto


WEIGHT_OPS = ("MatMul", "Gemm")
_LAYERNORM_OPS = {"LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization"}
_GELU_OPS = {"Gelu", "FastGelu", "BiasGelu", "Erf"}


@dataclass(frozen=True)
class TransformerScheme:
    """How one runtime runs INT8 transformer MatMuls.

    Attributes:
        name: short name for reports.
        activations: ``dynamic`` (quantized per call by the runtime) or ``calibrated`` (static Q/DQ ranges).
        activation_type / weight_type: ``onnxruntime.quantization.QuantType`` member names.
        why: the reason this runtime gets this scheme (goes into precision.json).
        qdq_as_written: ONNX Runtime only stands in for the runtime's INT8 kernels: its candidates are judged
            with the Q/DQ graph run as written (:func:`edgedeploy.onnxtools.ort.ort_session`).
    """

    name: str
    activations: Literal["dynamic", "calibrated"]
    activation_type: str
    weight_type: str
    why: str
    qdq_as_written: bool = False


TRANSFORMER_SCHEMES: dict[str, TransformerScheme] = {
    "onnxruntime": TransformerScheme(
        "dynamic-matmul",
        "dynamic",
        "QUInt8",
        "QInt8",
        "ONNX Runtime quantizes MatMul activations per call (DynamicQuantizeMatMul): no calibrated activation "
        "range, per-channel int8 weights; measured 0.99+ cosine and ~2x FP32 speed on a real BERT-class model",
    ),
    "tensorrt": TransformerScheme(
        "qdq-matmul",
        "calibrated",
        "QInt8",
        "QInt8",
        "TensorRT has no dynamic INT8: symmetric int8 Q/DQ on MatMul inputs and weights only (explicit "
        "quantization); softmax, LayerNorm, GELU and mask arithmetic stay float",
        qdq_as_written=True,
    ),
}


def scheme_for(runtime: str) -> TransformerScheme:
    """The transformer INT8 scheme of the target's runtime (by the Q/DQ flavour it registered).

    Raises:
        ConfigError: the runtime is not registered.
    """
    from edgedeploy import runtimes

    return TRANSFORMER_SCHEMES[runtimes.get(runtime).qdq_flavour]


# ---- detection ----------------------------------------------------------------------------------------


def _constant_names(model: ModelProto) -> set[str]:
    names = {i.name for i in model.graph.initializer}
    names |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return names


def weight_matmuls(model: ModelProto) -> list[str]:
    """Names of the MatMul / Gemm nodes whose second input is a constant 2-D weight."""
    inits = {i.name: i for i in model.graph.initializer}
    out = []
    for n in model.graph.node:
        if n.op_type in WEIGHT_OPS and len(n.input) > 1 and n.input[1] in inits and len(inits[n.input[1]].dims) == 2:
            out.append(n.name)
    return out


def transformer_evidence(model: ModelProto) -> dict[str, int]:
    """Op counts that tell a transformer from a CNN (for the report and :func:`looks_like_transformer`)."""
    consts = _constant_names(model)
    ops = [n.op_type for n in model.graph.node]
    layernorm = sum(o in _LAYERNORM_OPS for o in ops)
    # LayerNorm exported as primitives: ReduceMean -> Sub -> Pow -> ReduceMean -> Add -> Sqrt -> Div (2 means each)
    layernorm += sum(o == "ReduceMean" for o in ops) // 2 if "Sqrt" in ops else 0
    return {
        "weight_matmuls": len(weight_matmuls(model)),
        "activation_matmuls": sum(
            n.op_type == "MatMul" and not any(i in consts for i in n.input[:2]) for n in model.graph.node
        ),
        "softmax": ops.count("Softmax"),
        "layernorm": layernorm,
        "gelu": sum(o in _GELU_OPS for o in ops),
        "conv": ops.count("Conv") + ops.count("ConvTranspose"),
    }


def looks_like_transformer(evidence: dict[str, int]) -> bool:
    """Attention (activation x activation MatMul and Softmax) plus LayerNorm, with more weight MatMuls than
    convolutions (a ViT's single patch-embedding conv still counts as a transformer; a CNN with one attention
    block does not)."""
    e = evidence
    return bool(e["activation_matmuls"] and e["softmax"] and e["layernorm"] and e["weight_matmuls"] > max(e["conv"], 1))


# ---- graph rewrites ------------------------------------------------------------------------------------


def gemms_to_matmuls(model: ModelProto) -> list[str]:
    """Rewrite ``Gemm(A, W, C)`` with a constant ``W`` as ``MatMul(A, W') + C`` in place (ORT's dynamic
    quantizer has no integer Gemm). Only plain Gemms (alpha = beta = 1, no transA) are rewritten; the
    MatMul keeps the Gemm's name. Returns the rewritten node names."""
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    done = []
    nodes = list(model.graph.node)
    del model.graph.node[:]
    for n in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        plain = attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0 and not attrs.get("transA", 0)
        if n.op_type != "Gemm" or not plain or len(n.input) < 2 or n.input[1] not in inits:
            model.graph.node.append(n)
            continue
        w = numpy_helper.to_array(inits[n.input[1]])
        weight = n.input[1]
        if attrs.get("transB", 0):
            weight = f"{n.input[1]}_T"
            model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w.T), weight))
        has_bias = len(n.input) > 2 and n.input[2]
        mm_out = f"{n.output[0]}_matmul" if has_bias else n.output[0]
        model.graph.node.append(helper.make_node("MatMul", [n.input[0], weight], [mm_out], name=n.name))
        if has_bias:
            model.graph.node.append(helper.make_node("Add", [mm_out, n.input[2]], [n.output[0]], name=f"{n.name}_bias"))
        done.append(n.name)
    return done


def isolate_matmul_inputs(model: ModelProto, nodes: Sequence[str]) -> int:
    """Give the MatMuls ``nodes`` their own copy (``Identity``) of an input that other nodes also read, in place.

    ORT's static Q/DQ quantizer puts one Q/DQ pair on a tensor for all its readers, so the residual ``Add`` that
    reads a LayerNorm output beside Q/K/V would compute on INT8 values; after this, only the MatMuls do.
    Returns the number of inputs isolated.
    """
    from onnx import helper

    wanted = set(nodes)
    readers: dict[str, list[Any]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in model.graph.output}
    done = 0
    for tensor, users in list(readers.items()):
        mine = [n for n in users if n.name in wanted and n.input[0] == tensor]
        if not mine or (len(mine) == len(users) and tensor not in outputs):
            continue
        copy = f"{tensor}_to_matmul"
        first = min(list(model.graph.node).index(n) for n in mine)
        model.graph.node.insert(first, helper.make_node("Identity", [tensor], [copy], name=f"{copy}_identity"))
        for n in mine:
            n.input[0] = copy
        done += 1
    return done


# ---- quantization ---------------------------------------------------------------------------------------


@dataclass
class TransformerQuantizer:
    """Quantizes the weight MatMuls of one float transformer model in the target runtime's scheme.

    ``calib_batches`` feed the static ranges (``calibrated`` schemes); ORT's range cache in ``workdir`` is
    reused by every later call, so fallback tries cost one quantization each.
    """

    float_model: Path
    workdir: Path
    scheme: TransformerScheme
    calib_batches: Sequence[dict[str, np.ndarray]] = ()
    per_channel: bool = True
    reduce_range: bool = False
    _ranges_json: Path = field(init=False)

    def __post_init__(self) -> None:
        self._ranges_json = self.workdir / "ort_matmul_ranges.json"

    def ranges(self) -> dict[str, tuple[float, float]]:
        """Tensor name -> (lo, hi) of the static ranges (calibrated schemes, after one :meth:`quantize`)."""
        if not self._ranges_json.is_file():
            return {}
        from onnxruntime.quantization.calibrate import load_tensors_data

        data = load_tensors_data(self._ranges_json)
        out = {}
        for name in data:
            lo, hi = data[name].range_value
            out[name] = (float(np.asarray(lo).min()), float(np.asarray(hi).max()))
        return out

    def quantize(self, out: Path, nodes: Sequence[str]) -> Path:
        """Write the model with exactly ``nodes`` quantized (an empty list: the float model).

        Raises:
            StageError: onnxruntime.quantization fails (message names the cause).
        """
        if not nodes:
            shutil.copyfile(self.float_model, out)
            return out
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

        from edgedeploy.precision.data import OrtCalibrationReader

        with ort_quantization(
            "transformer INT8 quantization",
            "list the failing node in precision.keep_fp32, or set precision.int8_recipe = 'cnn'",
        ):
            if self.scheme.activations == "dynamic":
                quantize_dynamic(
                    str(self.float_model),
                    str(out),
                    op_types_to_quantize=["MatMul"],
                    per_channel=self.per_channel,
                    reduce_range=self.reduce_range,
                    weight_type=getattr(QuantType, self.scheme.weight_type),
                    nodes_to_quantize=list(nodes),
                    extra_options={"MatMulConstBOnly": True},
                )
            else:
                reader = None if self._ranges_json.is_file() else OrtCalibrationReader(self.calib_batches)
                quantize_static(
                    str(self.float_model),
                    str(out),
                    calibration_data_reader=reader,
                    quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=list(WEIGHT_OPS),
                    per_channel=self.per_channel,
                    reduce_range=self.reduce_range,
                    activation_type=getattr(QuantType, self.scheme.activation_type),
                    weight_type=getattr(QuantType, self.scheme.weight_type),
                    nodes_to_quantize=list(nodes),
                    extra_options={
                        "ActivationSymmetric": True,
                        "WeightSymmetric": True,
                        "MatMulConstBOnly": True,
                        "QuantizeBias": False,
                        # Q/DQ on the MatMul inputs only, no requantized outputs (see isolate_matmul_inputs)
                        "OpTypesToExcludeOutputQuantization": list(WEIGHT_OPS),
                    },
                    calibration_cache_path=str(self._ranges_json),
                )
        return out


def host_has_int8_dot() -> bool | None:
    """Whether this host's CPU multiplies int8 without int16 saturation (x86 VNNI / AMX, Arm dot product).

    None when unknown (no /proc/cpuinfo).
    """
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return None
    return bool({"avx512_vnni", "avx_vnni", "amx_int8", "asimddp"} & set(flags))


# ---- judging and fallback ----------------------------------------------------------------------------------


@dataclass
class TransformerResult:
    """What the transformer INT8 path decided (all plain data for precision.json).

    ``final``: the try shipped (the smallest passing float set found; the last try when none passed).
    ``start``: where the fallback sizes started and why (:func:`edgedeploy.precision.fallback.predicted_first_size`;
    empty when no fallback ran). ``stop``: why the search stopped. ``tries_spent``: it stopped because
    ``max_tries`` ran out with sizes left to try."""

    model: Path
    quantized: list[str]
    kept_float: dict[str, str]
    tries: list[dict[str, Any]]
    sensitivity: list[dict[str, Any]]
    met: bool
    final: dict[str, Any] = field(default_factory=dict)
    start: dict[str, Any] = field(default_factory=dict)
    stop: str = ""
    tries_spent: bool = False


def quantize_with_fallback(
    q: TransformerQuantizer,
    *,
    out: Path,
    candidates: Sequence[str],
    pinned: dict[str, str],
    reference: Path,
    calib: Sequence[dict[str, np.ndarray]],
    held_out: Sequence[dict[str, np.ndarray]],
    classifier_outputs: Sequence[str],
    accuracy_target: float,
    max_tries: int,
    run: Callable[[Path, Sequence[dict[str, np.ndarray]]], list[dict[str, np.ndarray]]],
    log: Callable[[str], None] | None = None,
    veto: Veto | None = None,
    deadline: float | None = None,
    float_proto: ModelProto | None = None,
    runner: Callable[[Path], Callable[[Sequence[dict[str, np.ndarray]]], list[dict[str, np.ndarray]]]] | None = None,
) -> TransformerResult:
    """Quantize every candidate not in ``pinned``; while the held-out score misses ``accuracy_target`` (or
    ``veto(model, held_out, outputs)`` gives a reason: the goldens check validation and the bundle's dry run run;
    ``outputs`` are the model's on ``held_out``, as judged), keep the ``k`` most sensitive MatMuls in float: ``k``
    from the size the ranking predicts (:func:`edgedeploy.precision.fallback.predicted_first_size`), doubled
    until a try passes, then bisected down to the smallest passing ``k`` (at most ``max_tries`` tries; none
    starts after ``deadline``, a ``time.monotonic()`` second: ``precision.time_budget_s``). ``float_proto``: the
    model ``q`` quantizes, when the caller holds it parsed already.

    Sensitivity is measured on calibration batches only (each MatMul quantized alone, relative L2 error at
    the outputs, all of them in one session: :func:`edgedeploy.precision.matmul_switch.switch_model`); scores
    are always on ``held_out``, against the float model ``reference``. Every model after the first is made from
    it by graph surgery (:mod:`edgedeploy.precision.matmul_switch`), not quantized again. A try is judged until
    its verdict is certain (:func:`edgedeploy.precision.heldout.held_out_until_decided`): one that can no longer
    meet the target stops early. ``runner(model)``: ``run`` on that model with its session opened once (default:
    ``run`` itself).

    Raises:
        StageError: ONNX Runtime cannot quantize or run a model.
    """
    from edgedeploy.precision.analysis import stopped_early
    from edgedeploy.precision.fallback import FamilySearch, predicted_first_size

    say = log or (lambda _line: None)
    ref_held = run(reference, held_out)

    last_output = list(ref_held[0])[-1] if ref_held else ""
    samples = sum(len(r[last_output]) for r in ref_held)  # as held_out_score counts them
    open_runner = runner or (lambda model: functools.partial(run, model))

    def judged(t: int, model: Path, floats: int) -> dict[str, Any]:
        score, judged_batches, outputs = held_out_until_decided(
            open_runner(model), ref_held, held_out, classifier_outputs, accuracy_target
        )
        why = veto(model, held_out, outputs) if veto is not None and score["score"] >= accuracy_target else None
        row = {"try": t, "float_matmuls": floats, **_brief(score), "met": score["score"] >= accuracy_target}
        if judged_batches < len(held_out):  # stopped early: the target out of reach (analysis.stopped_early)
            row.update(judged_samples=row["samples"], samples=samples)
        if why:
            row.update(met=False, vetoed=why)
        return row

    active = [n for n in candidates if n not in pinned]
    first = q.quantize(q.workdir / "tf0.int8.onnx", active)
    tries = [judged(0, first, len(candidates) - len(active))]
    chosen, kept, final = first, dict(pinned), tries[0]
    sensitivity: list[dict[str, Any]] = []
    start: dict[str, Any] = {}
    stop, spent = "", False
    if not tries[0]["met"] and max_tries > 0 and active:
        derive = _Derived(q, first, active, float_proto)
        say(
            f"INT8 held-out {tries[0]['metric']} {tries[0]['score']:.4f} < target {accuracy_target}: measuring the "
            f"sensitivity of {len(active)} MatMuls"
        )
        sensitivity = derive.sensitivity(list(calib[:4]), run(reference, list(calib[:4])))
        start = predicted_first_size(sensitivity, tries[0], accuracy_target)
        if start["predicted"] is not None:
            say(f"INT8 fallback: {start['why']}")
        models: dict[int, tuple[Path, dict[str, str], dict[str, Any]]] = {}

        def attempt(k: int, trial: dict[str, str], _family: str) -> tuple[bool, Path]:
            """The ``k`` most sensitive MatMuls float (``trial``: node -> why, the pinned ones included)."""
            model = derive.model(q.workdir / f"tf{len(tries)}.int8.onnx", [n for n in candidates if n not in trial])
            tries.append(judged(len(tries), model, len(trial)))
            vetoed = f" ({tries[-1]['vetoed']})" if "vetoed" in tries[-1] else ""
            say(
                f"INT8 fallback try {len(tries) - 1}: {len(trial)} MatMul(s) in float, "
                f"held-out {tries[-1]['metric']} {tries[-1]['score']:.4f}{stopped_early(tries[-1])}{vetoed}"
            )
            models[k] = (model, trial, tries[-1])
            return bool(tries[-1]["met"]), model

        def out_of_time() -> bool:
            return deadline is not None and time.monotonic() >= deadline

        def budget_left() -> bool:
            return len(tries) - 1 < max_tries and not out_of_time()

        # the CNN recipe's search over one family: doubled from the predicted size, then bisected
        search = FamilySearch(attempt, pinned, sensitivity, active, budget_left, families=("sensitivity",))
        search.grow_both(first=int(start["size"]))
        search.bisect("sensitivity")
        last = len(sensitivity)
        failed, passed = search.failed["sensitivity"], search.passed.get("sensitivity")
        shipped = passed if passed is not None else max(models, default=0)
        if shipped in models:
            chosen, kept, final = models[shipped]
        budget = "precision.time_budget_s" if out_of_time() else f"precision.max_fallback_tries = {max_tries}"
        if passed is not None and passed - failed <= 1:
            stop = f"the smallest passing set found: {passed} float, {failed} failed"
        elif passed is not None:
            stop = f"{budget} spent: {passed} float passed, {failed} failed"
        elif failed >= last:
            stop = f"every ranked MatMul float ({last}) still missed the target"
        else:
            stop, spent = f"{budget} spent before any try passed", True
        say(f"INT8 fallback search stopped: {stop}")
    shutil.copyfile(chosen, out)
    return TransformerResult(
        model=out,
        quantized=[n for n in candidates if n not in kept],
        kept_float=kept,
        tries=tries,
        sensitivity=sensitivity[:20],
        met=bool(final["met"]),
        final=final,
        start=start,
        stop=stop,
        tries_spent=spent,
    )


class _Derived:
    """The models the fallback needs, made from ``first`` (``active`` quantized) by graph surgery where
    :func:`edgedeploy.precision.matmul_switch.derivable` allows, else by quantizing again."""

    def __init__(
        self, q: TransformerQuantizer, first: Path, active: Sequence[str], float_proto: ModelProto | None = None
    ) -> None:
        import onnx

        from edgedeploy.precision import matmul_switch

        self.q, self.active = q, list(active)
        self.quantized = onnx.load(str(first))
        self.float_model = float_proto if float_proto is not None else onnx.load(str(q.float_model))
        self.surgery = matmul_switch.derivable(self.quantized, self.float_model, self.active)

    def model(self, out: Path, quantized: Sequence[str]) -> Path:
        """The model with exactly ``quantized`` (a subset of the first model's) INT8, written to ``out``.

        Raises:
            StageError: quantizing again (no surgery) fails.
        """
        if not self.surgery:
            return self.q.quantize(out, quantized)
        import onnx

        from edgedeploy.precision import matmul_switch

        model = onnx.ModelProto()
        model.CopyFrom(self.quantized)
        keep = set(quantized)
        matmul_switch.float_matmuls(model, self.float_model, [n for n in self.active if n not in keep])
        onnx.save(model, str(out))
        return out

    def sensitivity(
        self, probe: list[dict[str, np.ndarray]], ref_probe: list[dict[str, np.ndarray]]
    ) -> list[dict[str, Any]]:
        """Each active MatMul quantized alone, ``{"node", "op", "output_error"}`` on ``probe`` against
        ``ref_probe``, most sensitive first.

        Raises:
            StageError: a model cannot be quantized, loaded or run.
        """
        from edgedeploy.precision.analysis import batch_runner, output_error

        rows: list[dict[str, Any]] = []
        as_written = self.q.scheme.qdq_as_written
        ops = {n.name: n.op_type for n in self.float_model.graph.node}
        if not self.surgery:
            for i, node in enumerate(self.active):
                m = self.q.quantize(self.q.workdir / f"only{i}.int8.onnx", [node])
                # each probe batch in its own call, as the switching model runs them: dynamic INT8 quantizes
                # over the whole call, so joined batches would see each other's ranges
                runner = batch_runner(m, qdq_as_written=as_written)
                outputs = [runner([b])[0] for b in probe]
                rows.append({"node": node, "op": ops[node], "output_error": output_error(ref_probe, outputs)})
                m.unlink(missing_ok=True)
        else:
            import onnx

            from edgedeploy.precision import matmul_switch

            model = onnx.ModelProto()
            model.CopyFrom(self.quantized)
            gates = matmul_switch.switch_model(model, self.float_model, self.active)
            path = self.q.workdir / "tf.switch.onnx"
            onnx.save(model, str(path))
            runner = batch_runner(path, qdq_as_written=as_written)
            off = {gate: np.array(False) for gate in gates.values()}
            for node in self.active:  # the scalar gates keep each probe batch in its own call
                feeds = [{**b, **off, gates[node]: np.array(True)} for b in probe]
                rows.append({"node": node, "op": ops[node], "output_error": output_error(ref_probe, runner(feeds))})
            path.unlink(missing_ok=True)
        rows.sort(key=lambda r: r["output_error"], reverse=True)
        return rows


def _brief(score: dict[str, Any]) -> dict[str, Any]:
    first = next(iter(score["outputs"].values()))
    row = {"metric": score["metric"], "score": score["score"], "samples": score["samples"]}
    if "min" in first:
        row["min"] = min(o.get("min", o["value"]) for o in score["outputs"].values())
    return row


# ---- the recipe ------------------------------------------------------------------------------------------


def choose_recipe(setting: str, model: ModelProto) -> tuple[str, dict[str, int]]:
    """(``cnn`` or ``transformer``, the graph evidence) for ``precision.int8_recipe`` = ``setting``."""
    evidence = transformer_evidence(model)
    if setting != "auto":
        return setting, evidence
    return ("transformer" if looks_like_transformer(evidence) else "cnn"), evidence


def quantize_transformer(
    float_model: Path,
    out: Path,
    workdir: Path,
    *,
    scheme: TransformerScheme,
    batches: Sequence[dict[str, np.ndarray]],
    classifier_outputs: Sequence[str] = (),
    accuracy_target: float = 0.99,
    max_tries: int = 4,
    keep_fp32: Sequence[str] = (),
    smoothquant_alpha: float = 0.0,
    per_channel: bool = True,
    reduce_range: bool = False,
    log: Callable[[str], None] | None = None,
    veto: Veto | None = None,
    real_data: Sequence[dict[str, np.ndarray]] = (),
    deadline: float | None = None,
) -> tuple[TransformerResult, dict[str, Any], TransformerQuantizer]:
    """The transformer INT8 recipe on ``float_model``, written to ``out``.

    Steps: Gemm -> MatMul (dynamic schemes); hold out the last quarter of the batches; ranges of every float
    tensor on the calibration batches; absurd ranges (:func:`edgedeploy.precision.ranges.absurd_ranges`) and
    the weight MatMuls that touch them kept float; optional smoothing; quantize with fallback, judged on the held-out
    batches (and ``real_data``, validate.data's batches) against ``float_model``; ``veto(model, held_out, outputs)``
    refuses a candidate that meets the score but fails the goldens check (a reason, or None); no fallback try
    starts after ``deadline`` (``time.monotonic()`` seconds).

    Returns:
        the result, the plan entries for precision.json, and the quantizer (for its static ranges).

    Raises:
        StageError: quantization or range calibration fails.
    """
    import onnx

    from edgedeploy.precision.analysis import batch_runner, run_model
    from edgedeploy.precision.smoothquant import smooth

    model = onnx.load(str(float_model))
    for i, n in enumerate(model.graph.node):
        n.name = n.name or f"{n.op_type}_{i}"  # quantizers select nodes by name
    rewritten = gemms_to_matmuls(model) if scheme.activations == "dynamic" else []
    base = workdir / "tf.float.onnx"
    onnx.save(model, str(base))
    candidates = weight_matmuls(model)
    if not candidates:
        raise StageError(
            "precision",
            "transformer INT8 found no MatMul or Gemm with a constant 2-D weight to quantize",
            hint="use precision.int8_recipe = 'cnn' (or 'auto') for this model",
        )
    from edgedeploy.precision.data import split_heldout

    # the split the CNN recipe and the reference stage's goldens use, so the bundle's check judges these too
    calib, held = split_heldout(batches)
    # one batch holds nothing out: judged on validate.data alone, or (called without any, which the precision
    # stage refuses) on the calibration batch itself ("disjoint": false in the plan)
    disjoint = bool(held or real_data)
    held = (held or ([] if real_data else calib)) + list(real_data)
    channel = {n.input[0] for n in model.graph.node if n.name in set(candidates)} if smoothquant_alpha else set()
    stats = rng.collect_ranges(base, calib, workdir, channel_tensors=channel)
    absurd = rng.absurd_ranges(stats, model)
    touching = rng.nodes_touching(absurd, model, WEIGHT_OPS)
    pinned = {n: "listed in precision.keep_fp32" for n in keep_fp32}
    for node, tensor in touching.items():
        if node in candidates and node not in pinned:
            pinned[node] = f"reads or writes {tensor}: {absurd[tensor]['why']}"
    smoothing: dict[str, Any] = {"status": "off"}
    quant_input = base
    if smoothquant_alpha > 0:
        rows = smooth(model, stats, [c for c in candidates if c not in pinned], smoothquant_alpha)
        quant_input = workdir / "tf.smoothed.onnx"
        onnx.save(model, str(quant_input))
        smoothing = {"status": "on", "alpha": smoothquant_alpha, "activations": len(rows), "smoothed": rows[:50]}
    if scheme.activations == "calibrated" and isolate_matmul_inputs(model, candidates):
        quant_input = workdir / "tf.isolated.onnx"
        onnx.save(model, str(quant_input))
    q = TransformerQuantizer(quant_input, workdir, scheme, calib, per_channel=per_channel, reduce_range=reduce_range)
    result = quantize_with_fallback(
        q,
        out=out,
        candidates=candidates,
        pinned=pinned,
        reference=base,
        calib=calib,
        held_out=held,
        classifier_outputs=classifier_outputs,
        accuracy_target=accuracy_target,
        max_tries=max_tries,
        run=functools.partial(run_model, qdq_as_written=scheme.qdq_as_written),
        runner=functools.partial(batch_runner, qdq_as_written=scheme.qdq_as_written),
        log=log,
        veto=veto,
        deadline=deadline,
        float_proto=model,  # what quant_input holds: smoothed and isolated above where asked
    )
    if result.met and not result.quantized:  # an "INT8" artifact with every MatMul float is FP32 by another name
        out.unlink(missing_ok=True)
        missed = "; ".join(
            f"try {t['try']}: {t['float_matmuls']} float, {t['metric']} {t['score']:.4f}"
            + (f" ({t['vetoed']})" if "vetoed" in t else "")
            for t in result.tries[:-1]
        )
        raise StageError(
            "precision",
            f"transformer INT8 kept all {len(candidates)} weight MatMuls in float "
            f"({len(pinned)} pinned: keep_fp32 or absurd ranges; the rest by fallback), so nothing is INT8"
            + (f"; the tries with INT8 missed: {missed}" if missed else ""),
            hint="build fp32 instead, lower precision.accuracy_target or loosen tolerance.int8, "
            "or shorten precision.keep_fp32",
        )
    consumers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.name)
    plan = {
        "scheme": {
            "name": scheme.name,
            "activations": scheme.activations,
            "why": scheme.why,
            "per_channel": per_channel,
            "reduce_range": reduce_range,
        },
        "weight_matmuls": len(candidates),
        "quantized_matmuls": len(result.quantized),
        "gemms_rewritten_as_matmul": rewritten,
        "held_out": {
            "batches": len(held) - len(real_data),
            "validate_data_batches": len(real_data),
            "calibration_batches": len(calib),
            "disjoint": disjoint,
            "rule": "the last quarter of the calibration batches is held out (the goldens carry the same ones): never "
            "used for ranges, smoothing or sensitivity",
        },
        "absurd_ranges": [
            {"tensor": t, **info, "consumers": consumers.get(t, [])[:8]} for t, info in sorted(absurd.items())
        ],
        "smoothquant": smoothing,
    }
    return result, plan, q
