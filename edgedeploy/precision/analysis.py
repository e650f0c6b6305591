"""Precision analysis on calibration data: activation ranges (FP16 overflow / underflow), output error and
accuracy of a candidate model against the FP32 ONNX model.

Intermediate tensors are read by exposing them as graph outputs with onnxruntime.quantization's
``modify_model_output_intermediate_tensors`` and running the augmented model with graph optimizations
off (so tensor names survive); statistics are accumulated batch by batch, never held whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgedeploy.onnxtools.ort import ort_session

if TYPE_CHECKING:
    from onnx import ModelProto

FP16_MAX = 65504.0
FP16_SMALLEST = 2.0**-24  # smallest FP16 subnormal; smaller magnitudes round to zero
UNDERFLOW_FRACTION = 0.1  # flag a tensor when more than this share of its nonzero values flush to zero
_SAVED_SUFFIX = "_ReshapedSavedOutput"  # what modify_model_output_intermediate_tensors appends


BATCH_ROWS = 32  # samples per ONNX Runtime call when run_model batches several feeds into one, at most
# and at most this many input bytes per call: larger calls spill the activations out of the CPU caches (on
# EfficientNet-Lite0 at 224x224, 2 cores: 3.2 ms a sample in calls of 8 crops, 3.9 ms in calls of 32)
BATCH_BYTES = 4 << 20


def run_model(
    path: str | Path, batches: Sequence[dict[str, np.ndarray]], *, qdq_as_written: bool = False
) -> list[dict[str, np.ndarray]]:
    """Outputs of the model at ``path`` for every batch (name -> array).

    Batches that differ only in their leading (batch) dim are concatenated into calls of up to
    :data:`BATCH_ROWS` samples and :data:`BATCH_BYTES` of input where every input and output has a symbolic
    leading dim (many single-view feeds: a few calls, not hundreds), and the outputs are split back per batch.
    ``qdq_as_written``: a Q/DQ model runs as its operators define it (see
    :func:`edgedeploy.onnxtools.ort.ort_session`), the stand-in for a target's own INT8 kernels.
    """
    return batch_runner(path, qdq_as_written=qdq_as_written)(batches)


def batch_runner(
    path: str | Path, *, qdq_as_written: bool = False
) -> Callable[[Sequence[dict[str, np.ndarray]]], list[dict[str, np.ndarray]]]:
    """:func:`run_model` with the session opened once: a callable over any number of batch lists.

    Raises:
        StageError: ONNX Runtime cannot load the model (now, not at the first call).
    """
    sess = ort_session(path, stage="precision", qdq_as_written=qdq_as_written)
    names = [o.name for o in sess.get_outputs()]

    def one(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, sess.run(names, feeds)))

    joined = JoinedCalls(one)  # one check per session that joining changes no output

    def run(batches: Sequence[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        if not _batchable(sess, batches):
            return [one(b) for b in batches]
        sample_bytes = sum(v[:1].nbytes for v in batches[0].values())
        rows = max(1, min(BATCH_ROWS, BATCH_BYTES // max(sample_bytes, 1)))
        return [out for group in batch_groups(batches, rows) for out in joined(group)]

    return run


class JoinedCalls:
    """Each group of batches in one ``call`` on their concatenation, split back by rows (:func:`joined_run`), once
    the first group of two or more batches has shown that joining changes nothing: its last batch run alone gives
    what the joined call split off for it. Otherwise every batch runs alone, from then on: an output whose length
    only happens to equal the rows (``NonZero``'s hits, one per row) would be split among batches it is not from,
    and rows that see each other (a batch statistic) would answer for what else was in the call."""

    def __init__(self, call: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]) -> None:
        self.call = call
        self.trusted: bool | None = None  # None: not checked yet

    def __call__(self, group: Sequence[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        if len(group) < 2 or self.trusted is False:
            return [self.call(b) for b in group]
        parts = joined_run(group, self.call)
        if self.trusted is None:
            self.trusted = same_outputs(parts[-1], self.call(group[-1]))
            if not self.trusted:
                return [self.call(b) for b in group]
        return parts


def same_outputs(split: dict[str, np.ndarray], alone: dict[str, np.ndarray]) -> bool:
    """Whether a batch's outputs split off a joined call are what it gives alone: the same names, shapes and
    dtypes, integers equal, floats within the noise of another batch size's kernels (relative 1e-3 of the
    output's largest magnitude; 1e-2 for float16)."""
    if split.keys() != alone.keys():
        return False
    for name, want in alone.items():
        got = split[name]
        if got.shape != want.shape or got.dtype != want.dtype:
            return False
        if not np.issubdtype(want.dtype, np.floating):
            if not np.array_equal(got, want):
                return False
            continue
        finite = np.abs(want[np.isfinite(want)])
        scale = float(finite.max()) if finite.size else 0.0
        rel = 1e-2 if want.dtype == np.float16 else 1e-3
        if not np.allclose(got, want, rtol=rel, atol=rel * scale, equal_nan=True):
            return False
    return True


def joined_run(
    group: Sequence[dict[str, np.ndarray]], call: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    """Each batch's outputs from one ``call`` on the batches of ``group`` joined along the batch axis, split back
    by rows; one call per batch where an output lacks that axis (it cannot be split)."""
    if len(group) == 1:
        return [call(group[0])]
    rows = [len(next(iter(b.values()))) for b in group]
    outs = call({k: np.concatenate([b[k] for b in group]) for k in group[0]})
    if any(v.ndim == 0 or v.shape[0] != sum(rows) for v in outs.values()):
        return [call(b) for b in group]
    cuts = np.cumsum(rows)[:-1]
    parts = {k: np.split(v, cuts) for k, v in outs.items()}
    return [{k: np.ascontiguousarray(p[i]) for k, p in parts.items()} for i in range(len(group))]


def _batchable(sess: Any, batches: Sequence[dict[str, np.ndarray]]) -> bool:
    """Every input of ``sess`` has a symbolic leading dim, every output's leading dim is one of those symbols, and
    there is more than one batch.

    An output whose leading dim is another symbol (a count of detections, ``NonZero``'s) or unknown may not follow
    the batch: joined, its rows could add up to the batch rows by chance and be split among batches they are not
    from.
    """
    if len(batches) < 2:
        return False
    inputs = sess.get_inputs()
    if not all(a.shape and not isinstance(a.shape[0], int) for a in inputs):
        return False
    leads = {a.shape[0] for a in inputs if isinstance(a.shape[0], str)}
    return all(o.shape and isinstance(o.shape[0], str) and o.shape[0] in leads for o in sess.get_outputs())


def batch_groups(batches: Sequence[dict[str, np.ndarray]], rows: int) -> list[list[dict[str, np.ndarray]]]:
    """Consecutive ``batches`` with the same input names, dtypes and trailing shapes, up to ``rows`` samples a
    group (a batch without a batch axis stands alone): one model call per group, not one per batch."""
    groups: list[list[dict[str, np.ndarray]]] = []
    key: Any = None
    count = 0
    for b in batches:
        this = tuple(sorted((k, v.shape[1:], v.dtype.str) for k, v in b.items()))
        n = len(next(iter(b.values()))) if b and all(v.ndim > 0 for v in b.values()) else rows + 1
        if groups and this == key and count + n <= rows:
            groups[-1].append(b)
            count += n
        else:
            groups.append([b])
            key, count = this, n
    return groups


def _augmented(model_path: Path, workdir: Path) -> Path:
    from onnxruntime.quantization.qdq_loss_debug import modify_model_output_intermediate_tensors

    out = workdir / f"{model_path.stem}.exposed.onnx"
    modify_model_output_intermediate_tensors(str(model_path), str(out))
    return out


def intermediates(model_path: Path, batches: Sequence[dict[str, np.ndarray]], workdir: Path, *, optimize: bool = False):
    """Yield, per batch, {tensor name: array} of every float tensor in the model (inputs, intermediates, outputs).

    ``optimize``: ONNX Runtime's graph optimizations on. Every tensor is a graph output, so none is fused away
    and each keeps its name; the values move by float rounding (other kernels), about twice as fast on a CNN.
    """
    sess = ort_session(_augmented(model_path, workdir), optimize=optimize, stage="precision")
    names = [o.name for o in sess.get_outputs() if o.name.endswith(_SAVED_SUFFIX)]
    for b in batches:
        values = sess.run(names, b)
        yield {n[: -len(_SAVED_SUFFIX)]: v for n, v in zip(names, values)}


@dataclass
class TensorStats:
    """Range statistics of one tensor over the calibration batches."""

    lo: float = math.inf
    hi: float = -math.inf
    nonzero: int = 0
    flushed: int = 0  # nonzero values whose magnitude FP16 rounds to zero
    nonfinite: int = 0

    @property
    def absmax(self) -> float:
        return max(abs(self.lo), abs(self.hi)) if math.isfinite(self.lo) else 0.0

    def update(self, x: np.ndarray) -> None:
        x = x.astype(np.float64, copy=False)
        finite = np.isfinite(x)
        self.nonfinite += int((~finite).sum())
        x = x[finite]
        if x.size:
            self.lo = min(self.lo, float(x.min()))
            self.hi = max(self.hi, float(x.max()))
        mag = np.abs(x)
        nz = mag > 0
        self.nonzero += int(nz.sum())
        self.flushed += int((nz & (mag < FP16_SMALLEST / 2)).sum())


def tensor_ranges(model_path: Path, batches: Sequence[dict[str, np.ndarray]], workdir: Path) -> dict[str, TensorStats]:
    """Range statistics of every float tensor (graph inputs, intermediates, outputs) on ``batches``."""
    stats: dict[str, TensorStats] = {}
    for values in intermediates(model_path, batches, workdir):
        for name, v in values.items():
            stats.setdefault(name, TensorStats()).update(v)
    return stats


def fp16_findings(stats: dict[str, TensorStats], model: ModelProto) -> list[dict[str, Any]]:
    """Tensors whose range overflows FP16 (``|x| > 65504``) or badly underflows it, with producer and consumers."""
    producers = {o: n.name for n in model.graph.node for o in n.output}
    consumers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.name)
    found = []
    for name, s in sorted(stats.items()):
        row = {
            "tensor": name,
            "producer": producers.get(name, ""),
            "consumers": consumers.get(name, []),
            "absmax": s.absmax,
            "range": [s.lo, s.hi] if math.isfinite(s.lo) else None,
        }
        if s.absmax > FP16_MAX or s.nonfinite:
            found.append({**row, "issue": "overflow", "why": f"|x| reaches {s.absmax:.4g} > FP16 max {FP16_MAX:g}"})
        elif s.nonzero and s.flushed / s.nonzero > UNDERFLOW_FRACTION:
            share = s.flushed / s.nonzero
            found.append(
                {
                    **row,
                    "issue": "underflow",
                    "why": f"{share:.0%} of nonzero values are below FP16's smallest subnormal",
                }
            )
    return found


def fp16_pins(findings: list[dict[str, Any]]) -> dict[str, str]:
    """Node name -> reason, for the nodes that must stay FP32: producer and consumers of each overflowing tensor.

    The consumers are pinned too: a value that only exists in FP32 would overflow again when cast back
    to FP16 at the next node's input.
    """
    pins: dict[str, str] = {}
    for f in findings:
        if f["issue"] != "overflow":
            continue
        for node in [f["producer"], *f["consumers"]]:
            if node:
                pins.setdefault(node, f"FP16 overflow: {f['tensor']} {f['why']}")
    return pins


def output_error(reference: Sequence[dict[str, np.ndarray]], candidate: Sequence[dict[str, np.ndarray]]) -> float:
    """Relative L2 error ``||cand - ref|| / ||ref||`` over every output of every batch (inf for NaN/Inf)."""
    num = den = 0.0
    for r, c in zip(reference, candidate):
        for name, ref in r.items():
            diff = c[name].astype(np.float64) - ref.astype(np.float64)
            if not np.isfinite(diff).all():
                return math.inf
            num += float(np.sum(diff**2))
            den += float(np.sum(ref.astype(np.float64) ** 2))
    return math.sqrt(num) / max(math.sqrt(den), 1e-12)


def quantized_nodes(qdq_model: ModelProto) -> list[str]:
    """Names of the compute nodes the QDQ model quantized (those reading a DequantizeLinear output)."""
    dq_outputs = {o for n in qdq_model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return [
        n.name
        for n in qdq_model.graph.node
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and any(i in dq_outputs for i in n.input)
    ]


def check_node_names(names: Sequence[str], model: ModelProto, key: str) -> None:
    """Check that every node named under config ``key`` (e.g. ``precision.keep_fp32``) is in ``model``.

    Raises:
        ConfigError: names the key and the first unknown node names.
    """
    known = {n.name for n in model.graph.node}
    unknown = [n for n in names if n not in known]
    if unknown:
        from edgedeploy.errors import ConfigError

        raise ConfigError(
            f"key '{key}' names nodes not in model.onnx: {', '.join(unknown[:5])}",
            hint="use ONNX node names (e.g. from precision.json or Netron)",
        )


# ops that compute in integers whatever reads them (ONNX Runtime's operator-oriented and dynamic formats)
INTEGER_OPS = ("ConvInteger", "MatMulInteger", "DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "MatMulIntegerToFloat")
# float ops that run in INT8 on a QDQ backend when they read DequantizeLinear outputs
QDQ_COMPUTE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "LSTM", "GRU", "RNN")


def int8_compute_ops(model: Path) -> list[str]:
    """Names of the nodes of the model at ``model`` that compute in INT8: QLinear* and integer ops, and
    Conv/ConvTranspose/Gemm/MatMul/LSTM/GRU/RNN reading DequantizeLinear outputs (the QDQ format). Empty: the
    model is a float model, whatever its Q/DQ pairs around other ops."""
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    ops = {n.name: n.op_type for n in proto.graph.node}
    integer = [n.name for n in proto.graph.node if n.op_type.startswith("QLinear") or n.op_type in INTEGER_OPS]
    return integer + [n for n in quantized_nodes(proto) if ops.get(n) in QDQ_COMPUTE_OPS]


def int8_compute_left(model: Path) -> bool:
    """Whether the model at ``model`` still computes anything in INT8 (:func:`int8_compute_ops`): a fallback or a
    speed probe that put every compute node back in float leaves an FP32 model, not INT8."""
    return bool(int8_compute_ops(model))


def accuracy(
    reference: Sequence[dict[str, np.ndarray]],
    candidate: Sequence[dict[str, np.ndarray]],
    classifier_outputs: Sequence[str],
    groups: Sequence[int] | None = None,
) -> dict[str, Any]:
    """How well ``candidate`` agrees with ``reference`` over all batches.

    Classifier outputs score by top-1 agreement (the lower of the observed fraction and
    :func:`edgedeploy.precision.heldout.expected_top1_agreement`, both reported), others by cosine similarity;
    ``score`` is the worst output's.

    ``groups``: how many consecutive batches come from one independent source (the views of one held-out photo).
    With two or more groups (of at least ``MIN_GROUP_SAMPLES`` samples) a top-1 score is lowered by one standard
    error of the groups' expected agreement (``standard_error``): the score then bounds what new photos of the
    kind would show, not only these.
    """
    from edgedeploy.validate.parity import compare_output

    per_output: dict[str, dict[str, Any]] = {}
    for name in reference[0]:
        ref = np.concatenate([r[name] for r in reference])
        cand = np.concatenate([c[name] for c in candidate])
        classifier = name in classifier_outputs
        row = compare_output(ref, cand, atol=None, rtol=None, min_cosine=None, classifier=classifier)
        integer = bool(row.get("integer"))  # class ids, a label map: the share of values exactly equal
        metric = "top1_agreement" if (classifier or integer) and "top1_agreement" in row else "cosine"
        undefined = row.get(metric) is None  # cosine of (near) zero or under three values: nothing to judge
        value = 0.0 if row.get("nan") or row.get("inf") else 1.0 if undefined else float(row[metric])
        per_output[name] = {
            "metric": metric,
            "value": value,
            "cosine": row.get("cosine"),
            "max_abs": row.get("max_abs"),
        }
        if undefined:
            per_output[name]["n/a"] = row.get("cosine_na")
        if integer:
            per_output[name]["compared"] = "integer values, exactly"
        elif metric == "top1_agreement" and value > 0.0:
            from edgedeploy.precision.heldout import top1_score

            per_output[name].update(top1_score(value, ref, cand))
            if groups is not None and len(groups) > 1:
                se = _group_standard_error(ref, cand, reference, name, groups)
                per_output[name].update(value=max(0.0, per_output[name]["value"] - se), standard_error=se)
    worst = min(per_output.values(), key=lambda r: r["value"])
    return {"score": worst["value"], "metric": worst["metric"], "outputs": per_output}


JUDGED_GROUPS_PER_STEP = 2  # independent groups judged between two checks of whether the target is still reachable
# without independent groups, the batches are judged in this many steps, the same check after each
JUDGED_STEPS = 8


def accuracy_until_decided(
    model: str | Path,
    batches: Sequence[dict[str, np.ndarray]],
    reference: Sequence[dict[str, np.ndarray]],
    classifier_outputs: Sequence[str],
    groups: Sequence[int] | None,
    target: float,
    outputs: list[dict[str, np.ndarray]] | None = None,
    *,
    qdq_as_written: bool = False,
) -> tuple[dict[str, Any], int]:
    """(:func:`accuracy` of the model at ``model`` on ``batches``, how many batches it was judged on).

    The batches are judged a few independent groups at a time (``groups``; else in :data:`JUDGED_STEPS` steps),
    and the judging stops early only when the target can no longer be met, whatever the rest would show:

    - a classifier output's top-1 disagreements so far already keep its agreement over *all* the batches below
      ``target`` (the score is never above the observed agreement), or do once the least standard error the
      groups judged leave is taken off (:func:`least_standard_error`: the score is the agreement less the groups'
      standard error, and each group's expected agreement is final once judged);
    - a cosine output's agreement so far already keeps its cosine over all the batches below ``target``
      (:class:`CosineBound`: the rest at best lines up exactly with the reference);
    - an output is not finite.

    The accuracy is then that of the batches judged (it never meets the target: judging goes on where it would).
    A model that can still meet the target is judged on every batch, so a passing verdict is always the whole
    judge's. ``outputs``, when given, receives the model's outputs on the batches judged (in order), for checks
    of the same model on the same inputs (:func:`shared_inputs`). ``qdq_as_written``: as in :func:`run_model`.

    Raises:
        StageError: ONNX Runtime cannot load or run the model.
    """
    run = batch_runner(model, qdq_as_written=qdq_as_written)
    sink = outputs if outputs is not None else []
    # independent groups (two or more, covering the batches), else none
    sizes = list(groups) if groups is not None and len(groups) >= 2 and sum(groups) == len(batches) else []
    if sizes:
        ends = [int(e) for e in np.cumsum(sizes)]
        per_step = JUDGED_GROUPS_PER_STEP
    else:
        size = max(1, -(-len(batches) // JUDGED_STEPS))
        ends = list(range(size, len(batches), size)) + [len(batches)] if batches else []
        per_step = 1
    names = list(reference[0]) if reference else []
    classes = [n for n in names if n in classifier_outputs]
    # rows are counted per batch: only outputs with a batch axis and a class axis add up across batches
    rowwise = all(r[n].ndim >= 2 for r in reference for n in classes)
    total = {n: sum(r[n].size // max(r[n].shape[-1], 1) for r in reference) for n in classes} if rowwise else {}
    disagree = dict.fromkeys(total, 0)
    # each group's expected agreement, final once judged: what the standard error taken off the score is made of
    # (top-1 scores of float outputs whose groups all stay groups; integer ones are not lowered by it)
    spread: dict[str, list[float]] = {n: [] for n in total if sizes and _groups_kept(reference, n, sizes)}
    cosines = {n: CosineBound(reference, n) for n in names if n not in classifier_outputs}
    cosines = {n: b for n, b in cosines.items() if b.bounds}
    out: list[dict[str, np.ndarray]] = []
    done = 0
    while done < len(ends):
        step = min(done + per_step, len(ends))
        first, last = (ends[done - 1] if done else 0), ends[step - 1]
        part = run(batches[first:last])
        out.extend(part)
        judged_groups = sizes[done:step]
        done = step
        missed = False
        for name in names:
            got_parts = [c[name] for c in part]
            if any(not np.isfinite(g).all() for g in got_parts if g.dtype.kind == "f"):
                missed = True  # a non-finite output fails whatever the rest shows
                continue
            if name in cosines:
                # a hair under: the bound and the verdict sum the same values in another order
                missed |= cosines[name].add(reference[first:last], got_parts) < target - 1e-9
            if name not in total:
                continue
            ref = np.concatenate([r[name] for r in reference[first:last]])
            got = np.concatenate(got_parts)
            if got.shape != ref.shape:
                continue  # judged whole: the verdict below names the mismatch
            # top-1 by argmax, the rule of compare_output's top1_agreement (the verdict below)
            flat = ref.shape[-1]
            disagree[name] += int((ref.reshape(-1, flat).argmax(-1) != got.reshape(-1, flat).argmax(-1)).sum())
            best = (total[name] - disagree[name]) / max(total[name], 1)  # every row left agreeing
            if name in spread:
                spread[name] += _groups_expected(reference[first:last], part, name, judged_groups)
                best -= least_standard_error(spread[name], len(sizes))
            missed |= best < target
        if missed and done < len(ends):
            judged = ends[done - 1]
            partial = accuracy(reference[:judged], out, classifier_outputs, sizes[:done] or None)
            if partial["score"] < target:  # else (a subset's quirk) the rest is judged as well
                sink.extend(out)
                return partial, judged
    sink.extend(out)
    return accuracy(reference, out, classifier_outputs, groups), len(batches)


class CosineBound:
    """The highest cosine (:func:`edgedeploy.validate.parity.compare_output`'s: one over every value of every
    batch) an output can still reach once some batches are judged, the rest unseen.

    With ``a`` = the judged values' dot product over the candidate's norm there (their cosine times the
    reference's norm there) and ``b`` = the reference's norm over the batches not judged, the best any candidate
    values for the rest can give is ``sqrt(max(a, 0)^2 + b^2) / |reference|`` (Cauchy-Schwarz: the rest scaled
    along the reference): exact, never an estimate. ``bounds`` is False where the whole reference's cosine is
    undefined (too few values, (near) zero: scored 1.0) or holds non-finite values, and nothing is bounded."""

    def __init__(self, reference: Sequence[dict[str, np.ndarray]], name: str) -> None:
        from edgedeploy.validate.parity import cosine_undefined_why

        flat = [np.asarray(r[name]).ravel() for r in reference]
        values = np.concatenate(flat) if flat else np.zeros(0)
        self.bounds = (
            values.dtype.kind == "f" and bool(np.isfinite(values).all()) and cosine_undefined_why(values) is None
        )
        self.total = float(np.square(values.astype(np.float64)).sum()) if self.bounds else 0.0
        self.seen = self.dot = self.cand = 0.0
        self.name = name

    def add(self, reference: Sequence[dict[str, np.ndarray]], candidate: Sequence[np.ndarray]) -> float:
        """Take in the next judged batches (``reference``'s and the candidate's values of this output, finite);
        return the highest cosine still reachable."""
        for r, c in zip(reference, candidate):
            rf, cf = np.asarray(r[self.name], np.float64).ravel(), np.asarray(c, np.float64).ravel()
            if rf.shape != cf.shape:
                return 1.0  # judged whole: the verdict names the mismatch
            self.seen += float(rf @ rf)
            self.dot += float(rf @ cf)
            self.cand += float(cf @ cf)
        a = self.dot / math.sqrt(self.cand) if self.cand > 0 else 0.0
        rest = max(self.total - self.seen, 0.0)
        return math.sqrt(max(a, 0.0) ** 2 + rest) / math.sqrt(self.total)


def least_standard_error(judged: Sequence[float], groups: int) -> float:
    """The least standard error over ``groups`` groups' expected agreements (``ddof`` 1, as the score's) that the
    ``judged`` ones already fix, whatever the others turn out to be: the others all at the judged ones' mean,
    which adds nothing to the spread about the mean (any other values, or mean, add to it)."""
    if len(judged) < 2 or groups < 2:
        return 0.0
    values = np.asarray(judged, np.float64)
    spread = float(((values - values.mean()) ** 2).sum())
    return float(np.sqrt(spread / (groups - 1)) / np.sqrt(groups))


def _groups_kept(reference: Sequence[dict[str, np.ndarray]], name: str, groups: Sequence[int]) -> bool:
    """Whether :func:`_group_standard_error` keeps every group of ``groups`` as it is (each holds at least
    ``MIN_GROUP_SAMPLES`` samples, so none is merged) and the output ``name`` is a float top-1 score it lowers."""
    if len(groups) < 2 or reference[0][name].dtype.kind != "f":
        return False
    sizes = [len(r[name]) for r in reference]
    ends = np.cumsum(groups)
    return all(sum(sizes[end - n : end]) >= MIN_GROUP_SAMPLES for end, n in zip(ends, groups))


def _groups_expected(
    reference: Sequence[dict[str, np.ndarray]],
    candidate: Sequence[dict[str, np.ndarray]],
    name: str,
    groups: Sequence[int],
) -> list[float]:
    """Each group's expected top-1 agreement (as :func:`_group_standard_error` takes it) for batches that hold
    exactly ``groups`` (batches per group, in order)."""
    from edgedeploy.precision.heldout import expected_top1_agreement

    values, start = [], 0
    for n in groups:
        ref = np.concatenate([r[name] for r in reference[start : start + n]])
        got = np.concatenate([c[name] for c in candidate[start : start + n]])
        values.append(expected_top1_agreement(ref.reshape(-1, ref.shape[-1]), got.reshape(-1, got.shape[-1])))
        start += n
    return values


def shared_inputs(first: Sequence[dict[str, np.ndarray]], second: Sequence[dict[str, np.ndarray]]) -> dict[int, int]:
    """Index in ``first`` -> index in ``second`` of a batch with exactly the same inputs (names, shapes, dtypes
    and values), for batches found in both: a model's outputs on one are its outputs on the other."""

    def key(batch: dict[str, np.ndarray]) -> tuple[Any, ...]:
        # a strided sample of the values keys the lookup; np.array_equal below decides
        return tuple(
            sorted((k, v.shape, v.dtype.str, np.ravel(v)[:: max(1, v.size // 64)].tobytes()) for k, v in batch.items())
        )

    index: dict[tuple[Any, ...], list[int]] = {}
    for j, batch in enumerate(second):
        index.setdefault(key(batch), []).append(j)
    found: dict[int, int] = {}
    for i, batch in enumerate(first):
        for j in index.get(key(batch), []):
            if all(np.array_equal(v, second[j][k]) for k, v in batch.items()):
                found[i] = j
                break
    return found


def stopped_early(row: dict[str, Any]) -> str:
    """`` on 96 of 512 samples (the rest cannot lift it to the target)`` for a try whose judging stopped when the
    target was out of reach (:func:`accuracy_until_decided`); else empty."""
    if "judged_samples" not in row:
        return ""
    return f" on {row['judged_samples']} of {row['samples']} samples (the rest cannot lift it to the target)"


# fewer samples than this do not make a group: consecutive small groups (single validate.data samples) are
# merged until they do, so each group's spread of top-1 lead changes is measured on enough samples
MIN_GROUP_SAMPLES = 8


def _group_standard_error(
    ref: np.ndarray, cand: np.ndarray, batches: Sequence[dict[str, np.ndarray]], name: str, groups: Sequence[int]
) -> float:
    """Standard error of the mean over ``groups`` (batches per group, in order; merged up to
    ``MIN_GROUP_SAMPLES``) of each group's expected top-1 agreement; ``ref`` / ``cand``: output ``name`` of all
    ``batches``, concatenated."""
    from edgedeploy.precision.heldout import expected_top1_agreement

    sizes = [len(b[name]) for b in batches]
    if sum(groups) != len(sizes):
        raise ValueError(f"groups cover {sum(groups)} batches, the data has {len(sizes)}")
    per_sample = len(ref.reshape(-1, ref.shape[-1])) // max(sum(sizes), 1)  # rows per sample (extra leading axes)
    bounds, start, end = [], 0, 0
    for batch_end, n in zip(np.cumsum(groups), groups):
        end += sum(sizes[batch_end - n : batch_end]) * per_sample
        if end - start >= MIN_GROUP_SAMPLES * per_sample:
            bounds.append((start, end))
            start = end
    if start < end and bounds:  # a short tail joins the last group
        bounds[-1] = (bounds[-1][0], end)
    if len(bounds) < 2:
        return 0.0
    r, c = ref.reshape(-1, ref.shape[-1]), cand.reshape(-1, cand.shape[-1])
    per_group = [expected_top1_agreement(r[a:b], c[a:b]) for a, b in bounds]
    return least_standard_error(per_group, len(per_group))  # every group judged: the standard error itself


def measure_latency(
    path: Path, feeds: dict[str, np.ndarray], *, warmup: int, iters: int, qdq_as_written: bool = False
) -> dict[str, Any]:
    """p50/p90 latency of the model at ``path`` in ONNX Runtime (all optimizations) on ``feeds``
    (``qdq_as_written``: as in :func:`run_model`)."""
    from edgedeploy.validate.latency import time_calls as latency

    sess = ort_session(path, stage="precision", qdq_as_written=qdq_as_written)
    names = [o.name for o in sess.get_outputs()]
    row = latency(lambda f: sess.run(names, f), feeds, warmup=warmup, iters=iters)
    return {k: row[k] for k in ("p50_ms", "p90_ms", "iters", "shape")}
