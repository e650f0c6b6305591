"""Numerical comparison of a candidate's outputs with the reference's (numpy only, no torch).

Kept free of torch and of newer-Python syntax (it runs on Python 3.6, JetPack 4.6's) so the
device-side bundle step can copy it and judge a TensorRT engine against the goldens there.

Failure codes (``row["failure"]``), one per kind of problem, so reports and gates can tell them apart:

- ``non-finite output``: the candidate has NaN or Inf values (never passes, whatever the tolerance);
- ``shape mismatch``: the candidate's output shape differs from the reference's;
- ``outside tolerance``: some element breaks ``|cand - ref| <= atol + rtol * |ref|``;
- ``cosine``: cosine similarity below ``min_cosine``;
- ``top-k agreement``: top-1 agreement of a classifier output more than one standard error below
  ``min_topk_agreement`` (pooled over the goldens: :func:`pooled_top1`).

Top-1 agreement is judged once per classifier output, pooled over the goldens made from real samples
(points ``data`` and ``calib-heldout``: validation data, calibration samples held out of calibration), by
:func:`pooled_top1` — not per golden: a golden of batch 1 agrees 0 or 1, and on spec-random inputs a
classifier's scores are near-ties whose order any rounding flips. Spec-random goldens are judged by their
elementwise tolerance and cosine.

A row whose reference and candidate are both constant, or the same for every golden sample (a model that ignores
its input), is marked ``vacuous`` (reported as such, never as ok): agreement between two constants says nothing
about the model. When every row that judges agreement is vacuous, a failing ``vacuous`` row says so
(:func:`vacuous_verdict`): the build, the device run and the gate fail it alike.

One judge (:func:`judge_goldens`), used by host validation, the precision stage's check of INT8 candidates
and the device bundle's own run: for FP16 and INT8 artifacts, task agreement (elementwise tolerance, cosine,
top-1) is judged on real-sample goldens only. Spec-random goldens (uniform noise no user sends) still fail on
what they can show (non-finite values, a wrong shape) and report their errors as ``informational`` rows. A
build with no real-sample golden at all (FP16 without calibration data or ``validate.data``) is judged on the
spec-random ones, as that is all there is. FP32 artifacts are judged on every golden.

Cosine similarity is undefined (``None``, reported as n/a) on an output of fewer than
``MIN_COSINE_ELEMENTS`` elements and on a reference of (near) zero norm. Such a short output (a score, a
probability) is judged once, pooled over the real-sample goldens (:func:`pooled_cosine`), by the cosine about
the reference's mean (:func:`centred_cosine`): a candidate that ignores its input, or shifts every value, fails
it however close its values sit to the reference's.
"""

# ruff: noqa: UP006, UP035, UP045, UP032  (Python 3.6 syntax on purpose: copied into device bundles)
from typing import Any, Collection, Dict, List, Optional

import numpy as np

NON_FINITE = "non-finite output"
SHAPE_MISMATCH = "shape mismatch"
OUTSIDE_TOLERANCE = "outside tolerance"
LOW_COSINE = "cosine"
LOW_TOPK = "top-k agreement"

# goldens points made from real samples (validate.data; calibration samples held out of calibration); the
# other points (min/opt/max) are spec-random inputs
REAL_DATA_POINTS = ("data", "calib-heldout")
TOP1_CHECK = "top1_agreement"  # the check name of pooled_top1's rows
POOLED_COSINE_CHECK = "pooled_cosine"  # the check name of pooled_cosine's rows
# precisions whose task agreement is judged on real samples only (spec-random goldens are informational)
REDUCED_PRECISIONS = ("fp16", "int8")
# failure codes that say something about task agreement: informational on spec-random goldens of FP16/INT8
AGREEMENT_FAILURES = (OUTSIDE_TOLERANCE, LOW_COSINE, LOW_TOPK)
# cosine of a vector this short is a sign or an angle between two points, not a similarity
MIN_COSINE_ELEMENTS = 3
# a reference whose root mean square is below this has no direction to agree with
NEAR_ZERO_RMS = 1e-6
INTEGER_NA = "n/a: integer output, compared value by value"
SHORT_ROWS_NA = "n/a: {} value(s) per sample, judged pooled about the reference's mean (pooled_cosine)"
# The pooled top-1 check fails an artifact whose agreement is more than one standard error (Wilson score
# interval, z = 1) below the target. A count on a few dozen goldens cannot resolve a target of 0.95: on 96
# views of 16 photos one ambiguous photo moves it by 6 points, and EfficientNet-Lite0 INT8 models that agree
# >= 96 % on 3,000 crops counted 93.75-94.8 % there (bench/int8_cnn_judge.json). The build's precision stage
# establishes the target on more samples; this check catches an artifact clearly worse than that.
TOP1_SAMPLING_Z = 1.0

# Fixed log10(|error|) bin edges, so histograms from several samples and shapes add up.
HIST_LOG10_MIN = -12
HIST_LOG10_MAX = 2
HIST_BINS_PER_DECADE = 2


def histogram_edges() -> List[float]:
    """The log10 bin edges every error histogram uses (values below the first go into bin 0)."""
    n = (HIST_LOG10_MAX - HIST_LOG10_MIN) * HIST_BINS_PER_DECADE
    return [HIST_LOG10_MIN + i / HIST_BINS_PER_DECADE for i in range(n + 1)]


def empty_histogram() -> Dict[str, Any]:
    """A histogram of absolute errors with no values yet (see :func:`add_to_histogram`)."""
    edges = histogram_edges()
    return {"scale": "log10_abs_error", "edges": edges, "counts": [0] * (len(edges) - 1), "exact": 0, "non_finite": 0}


def add_to_histogram(hist: Dict[str, Any], ref: np.ndarray, cand: np.ndarray) -> None:
    """Add the elementwise absolute errors of ``cand`` vs ``ref`` to ``hist`` (in place).

    Exact matches are counted in ``exact`` (log10(0) has no bin); non-finite candidate values in
    ``non_finite``; errors beyond the last edge go into the last bin.
    """
    if ref.shape != cand.shape:
        return
    c = cand.astype(np.float64)
    r = ref.astype(np.float64)
    finite = np.isfinite(c) & np.isfinite(r)
    hist["non_finite"] += int((~np.isfinite(c)).sum())
    diff = np.abs(c - r)[finite]
    hist["exact"] += int((diff == 0).sum())
    diff = diff[diff > 0]
    if not diff.size:
        return
    edges = np.asarray(hist["edges"])
    logs = np.clip(np.log10(diff), edges[0], edges[-1])
    counts, _ = np.histogram(logs, bins=edges)
    hist["counts"] = [int(a + b) for a, b in zip(hist["counts"], counts)]


def compare_output(
    ref: np.ndarray,
    cand: np.ndarray,
    *,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    min_cosine: Optional[float] = None,
    min_topk_agreement: Optional[float] = None,
    topk: int = 1,
    classifier: bool = False,
    agreement: bool = True,
    exact_integers: bool = True,
) -> Dict[str, Any]:
    """Error figures for one output and whether they pass the tolerance.

    An integer or boolean output (class ids, a label map, a count) is a decision, not a measurement: it has no
    cosine, and its agreement is the share of values that are exactly equal (``top1_agreement`` over
    ``top1_rows`` values, pooled by :func:`pooled_top1` like a classifier's top-1). With ``exact_integers``
    (no ``min_topk_agreement`` to pool against) and no atol / rtol, every value must be equal.

    ``agreement`` False (a spec-random golden of an FP16/INT8 artifact, :func:`judges_agreement`): the
    tolerance, cosine and top-k figures are reported (``informational`` holds what they would have failed) but
    only non-finite values and a shape mismatch fail the row.

    Figures: max and p99 of the absolute and relative error, cosine similarity, NaN and Inf
    counts, and for classifier outputs (last axis = classes) top-1 agreement and top-k overlap.
    The elementwise check is ``|cand - ref| <= atol + rtol * |ref|`` (numpy.allclose's rule);
    NaN or Inf in the candidate never passes (failure code ``non-finite output``).
    """
    row = {"shape_ref": list(ref.shape), "shape_cand": list(cand.shape)}  # type: Dict[str, Any]
    if ref.shape != cand.shape:
        row.update(
            passed=False,
            failure=[SHAPE_MISMATCH],
            reason="{}: got {}, reference {}".format(SHAPE_MISMATCH, list(cand.shape), list(ref.shape)),
        )
        return row
    r = ref.astype(np.float64)
    c = cand.astype(np.float64)
    nan = int(np.isnan(c).sum())
    inf = int(np.isinf(c).sum())
    row.update(nan=nan, inf=inf)
    failures = []  # type: List[str]
    reasons = []  # type: List[str]
    if nan or inf:
        failures.append(NON_FINITE)
        reasons.append("{}: {} NaN and {} Inf values".format(NON_FINITE, nan, inf))
    finite = np.isfinite(c) & np.isfinite(r)
    diff = np.abs(c - r)[finite]
    rel = (diff / np.maximum(np.abs(r[finite]), 1e-12)) if diff.size else diff
    row["max_abs"] = float(diff.max()) if diff.size else 0.0
    row["p99_abs"] = float(np.percentile(diff, 99)) if diff.size else 0.0
    row["max_rel"] = float(rel.max()) if rel.size else 0.0
    row["p99_rel"] = float(np.percentile(rel, 99)) if rel.size else 0.0
    rf, cf = r[finite].ravel(), c[finite].ravel()
    integer = ref.dtype.kind in "biu"
    if integer:
        # a mean over class ids or label values says nothing: the values agree or they do not
        equal = r == c
        row.update(cosine=None, cosine_na=INTEGER_NA, integer=True)
        row["top1_agreement"] = float(equal.mean()) if equal.size else 1.0
        row["top1_rows"] = int(equal.size)
        if exact_integers and atol is None and rtol is None and not equal.all():
            first = int(np.argmax(~equal.ravel()))
            failures.append(OUTSIDE_TOLERANCE)
            reasons.append(
                "{}: {} of {} integer values differ, compared exactly (first at flat index {}: ref {}, got {})".format(
                    OUTSIDE_TOLERANCE, int((~equal).sum()), equal.size, first, ref.ravel()[first], cand.ravel()[first]
                )
            )
    else:
        row["cosine"] = cosine_or_none(rf, cf)
    if row["cosine"] is None and not integer:
        row["cosine_na"] = cosine_undefined_why(rf)
    if atol is not None or rtol is not None:
        a = atol or 0.0
        t = rtol or 0.0
        with np.errstate(invalid="ignore"):
            ok = np.abs(c - r) <= a + t * np.abs(r)
        outside = int((~ok & np.isfinite(c)).sum())
        if outside:
            excess = np.where(np.isfinite(c), np.abs(c - r) - t * np.abs(r), -np.inf)
            worst = int(np.argmax(excess))
            failures.append(OUTSIDE_TOLERANCE)
            where = "worst at flat index {}: ref {:.6g}, got {:.6g}".format(worst, r.ravel()[worst], c.ravel()[worst])
            text = "{}: {} of {} values exceed atol={:g} rtol={:g} ({})"
            reasons.append(text.format(OUTSIDE_TOLERANCE, outside, ok.size, a, t, where))
    if min_cosine is not None and row["cosine"] is not None and row["cosine"] < min_cosine:
        failures.append(LOW_COSINE)
        reasons.append("{}: {:.6f} < {}".format(LOW_COSINE, row["cosine"], min_cosine))
    if classifier and not integer and ref.ndim >= 1 and ref.shape[-1] > 0:
        classes = ref.shape[-1]
        k = min(topk, classes)
        ref_top = np.argsort(-r.reshape(-1, classes), axis=-1)[:, :k]
        # NaN ranks last. Not np.nan_to_num(c, nan=-np.inf): its keywords need numpy >= 1.17 and
        # JetPack 4.6 ships numpy 1.13.3 (tests/test_device_numpy_compat.py keeps device code to 1.13)
        ranked = np.where(np.isnan(c), -np.inf, c)
        cand_top = np.argsort(-ranked.reshape(-1, classes), axis=-1)[:, :k]
        # top-1 by argmax (the first of tied maxima), as the precision judge's early stop counts disagreements
        top1 = float((r.reshape(-1, classes).argmax(-1) == ranked.reshape(-1, classes).argmax(-1)).mean())
        row["top1_agreement"] = top1
        row["top1_rows"] = int(ref_top.shape[0])
        row["topk"] = k
        row["topk_overlap"] = float(np.mean([len(set(a) & set(b)) / float(k) for a, b in zip(ref_top, cand_top)]))
        if min_topk_agreement is not None and top1 < min_topk_agreement:
            failures.append(LOW_TOPK)
            reasons.append("{}: top-1 agreement {:.4f} < {}".format(LOW_TOPK, top1, min_topk_agreement))
    row["agreement_judged"] = bool(agreement)
    if not agreement:
        info = [why for code, why in zip(failures, reasons) if code in AGREEMENT_FAILURES]
        reasons = [why for code, why in zip(failures, reasons) if code not in AGREEMENT_FAILURES]
        failures = [code for code in failures if code not in AGREEMENT_FAILURES]
        if info:
            row["informational"] = "; ".join(info)
    row["passed"] = not failures
    # both sides constant (an all-masked batch, a dead output): agreement proves nothing
    row["vacuous"] = bool(rf.size > 1 and np.ptp(rf) == 0 and cf.size > 1 and np.ptp(cf) == 0)
    if failures:
        row["failure"] = failures
        row["reason"] = "; ".join(reasons)
    return row


def cosine_undefined_why(ref: np.ndarray) -> Optional[str]:
    """Why the cosine similarity against ``ref`` (flat) is undefined, or None when it is defined."""
    if ref.size < MIN_COSINE_ELEMENTS:
        return "n/a: {} element(s), cosine needs {}".format(ref.size, MIN_COSINE_ELEMENTS)
    if float(np.sqrt(np.mean(ref.astype(np.float64) ** 2))) < NEAR_ZERO_RMS:
        return "n/a: reference is (near) zero"
    return None


def cosine_or_none(ref: np.ndarray, cand: np.ndarray) -> Optional[float]:
    """Cosine similarity of two flat vectors; None where undefined (:func:`cosine_undefined_why`)."""
    if cosine_undefined_why(ref) is not None:
        return None
    denom = float(np.linalg.norm(ref) * np.linalg.norm(cand))
    return float(ref @ cand / denom) if denom > 0 else 0.0


def centred_cosine(ref: np.ndarray, cand: np.ndarray) -> Optional[float]:
    """Cosine of ``cand - mean(ref)`` with ``ref - mean(ref)`` (flat): how well the candidate follows the
    reference's variation about its mean. A constant candidate scores 0 and a shifted one loses by the shift
    against the reference's spread, where a plain cosine of values sharing a large offset stays near 1. None
    where the centred reference is undefined for a cosine (:func:`cosine_undefined_why`: too few values, or no
    variation)."""
    r = np.asarray(ref, dtype=np.float64).ravel()
    mean = float(r.mean()) if r.size else 0.0
    return cosine_or_none(r - mean, np.asarray(cand, dtype=np.float64).ravel() - mean)


def pooled_cosine(pools: Dict[str, List[Any]], min_cosine: Optional[float], real: bool) -> List[Dict[str, Any]]:
    """One row per output too short for a cosine per golden: :func:`centred_cosine` over the values of every
    golden in its pool (``pools``: output -> [(reference, candidate), ...], the goldens that judge agreement),
    judged against ``min_cosine`` (none: reported only)."""
    out = []  # type: List[Dict[str, Any]]
    for name in sorted(pools):
        pairs = pools[name]
        ref = np.concatenate([np.asarray(r, dtype=np.float64).ravel() for r, _ in pairs])
        cand = np.concatenate([np.asarray(c, dtype=np.float64).ravel() for _, c in pairs])
        cos = centred_cosine(ref, cand)
        passed = cos is None or min_cosine is None or cos >= min_cosine
        row = pooled_row(POOLED_COSINE_CHECK, name, real, cosine=cos, rows=len(pairs), passed=passed)
        if cos is None:
            row["cosine_na"] = "n/a: the reference does not vary over these goldens"
        elif not row["passed"]:
            row["failure"] = [LOW_COSINE]
            row["reason"] = "{}: {:.6f} < {} (about the reference's mean, pooled over {} goldens)".format(
                LOW_COSINE, cos, min_cosine, len(pairs)
            )
        out.append(row)
    return out


def judges_agreement(point: str, precision: str, real_samples: bool) -> bool:
    """Whether a golden at ``point`` judges task agreement (tolerance, cosine, top-1) of a ``precision``
    artifact: always for FP32; for FP16/INT8 on real-sample goldens, or on any when ``real_samples`` is False
    (no real-sample golden exists)."""
    return precision not in REDUCED_PRECISIONS or point in REAL_DATA_POINTS or not real_samples


def judge_goldens(
    cases: List[Any],
    results: List[Dict[str, Any]],
    precision: str,
    tolerance: Dict[str, Any],
    outputs: Optional[List[str]] = None,
    topk: int = 1,
    classifier_outputs: Optional[List[str]] = None,
) -> List[Dict[str, Any]]:
    """Every golden judged by the one rule: rows per (point, sample, output), then pooled top-1 rows.

    ``cases``: ``(point, sample, pair)`` with ``pair["out"]`` the reference outputs (and ``pair["sparse"]``,
    name -> (shape, stride), for outputs stored as every ``stride``-th element, see ``sparse_values``);
    ``results``: the candidate's outputs, one dict per case. ``tolerance``: atol / rtol / min_cosine /
    min_topk_agreement of ``precision`` (None disables one). Agreement rule: :func:`judges_agreement`.
    """
    classifiers = list(classifier_outputs or [])
    real = any(point in REAL_DATA_POINTS for point, _, _ in cases)
    rows = []  # type: List[Dict[str, Any]]
    short = {}  # type: Dict[str, List[Any]]  # output -> (ref, cand) of goldens too short for their own cosine
    for (point, sample, pair), got in zip(cases, results):
        sparse = pair.get("sparse") or {}
        for name in outputs or sorted(pair["out"]):
            if name not in pair["out"]:
                continue
            ref = pair["out"][name]
            if name not in got:
                row = {"passed": False, "failure": ["missing output"],
                       "reason": "output {!r} missing (runner gave {})".format(name, sorted(got))}  # fmt: skip
            else:
                cand = np.asarray(got[name])
                if name in sparse:
                    shape, stride = sparse[name]
                    if list(cand.shape) != list(shape):
                        row = compare_output(np.zeros(shape, np.float32), cand)  # a shape mismatch row
                        rows.append(dict(row, shape=point, sample=sample, output=name))
                        continue
                    cand = sparse_values(cand, stride, ref.size)
                # under 3 values per sample (a score per row of a batch): a cosine over the batch's few values is
                # dominated by their shared offset, so such an output is judged by the pooled centred cosine only,
                # whatever the batch size
                short_rows = per_sample_values(ref) < MIN_COSINE_ELEMENTS and name not in sparse
                row = compare_output(
                    ref,
                    cand,
                    atol=tolerance.get("atol"),
                    rtol=tolerance.get("rtol"),
                    min_cosine=None if short_rows else tolerance.get("min_cosine"),
                    topk=topk,
                    classifier=name in classifiers and name not in sparse,
                    agreement=judges_agreement(point, precision, real),
                    exact_integers=tolerance.get("min_topk_agreement") is None,
                )
                if name in sparse:
                    row["stored_every"] = int(sparse[name][1])
                if short_rows and not row.get("integer") and "cosine" in row:
                    row.update(cosine=None, cosine_na=SHORT_ROWS_NA.format(per_sample_values(ref)))
                pooled = row.get("agreement_judged") and short_rows and cand.shape == ref.shape
                pooled = pooled and not row.get("integer")  # integer values pool by exact agreement (pooled_top1)
                if pooled and np.isfinite(cand).all():
                    short.setdefault(name, []).append((ref, cand))
            row.update(shape=point, sample=sample, output=name)
            rows.append(row)
    _mark_input_independent(cases, results, rows)
    rows += ignored_input(cases, results, precision, real)
    rows += pooled_top1(rows, tolerance.get("min_topk_agreement"))
    rows += pooled_cosine(short, tolerance.get("min_cosine"), real)
    return rows + vacuous_verdict(rows, real)


def per_sample_values(ref: np.ndarray) -> int:
    """Values per sample of an output: those of one row of its leading (batch) axis when it has two or more
    axes; else all of them (a 1-D output may not have a batch axis)."""
    if ref.ndim >= 2 and ref.shape[0]:
        return int(ref.size // ref.shape[0])
    return int(ref.size)


def _sample_rows(arrays: List[Any]) -> Optional[np.ndarray]:
    """The per-sample rows (leading axis) of every array, stacked; None where they cannot be lined up."""
    flat = []  # type: List[np.ndarray]
    for a in arrays:
        a = np.asarray(a)
        if a.ndim == 0 or a.shape[0] == 0:
            return None
        flat.append(a.reshape(a.shape[0], -1).astype(np.float64))
    if not flat or len(set(f.shape[1] for f in flat)) != 1:
        return None
    return np.concatenate(flat)


def _stacked(name: str, pairs: List[Any]) -> Optional[Any]:
    """(reference, candidate) per-sample rows of output ``name`` over ``pairs`` (golden pair, candidate outputs),
    stacked; None where an output is missing or stored sparingly, the rows cannot be lined up, or fewer than two."""
    if any(name not in got or name not in pair["out"] or name in (pair.get("sparse") or {}) for pair, got in pairs):
        return None
    ref = _sample_rows([pair["out"][name] for pair, _ in pairs])
    cand = _sample_rows([got[name] for _, got in pairs])
    if ref is None or cand is None or ref.shape != cand.shape or ref.shape[0] < 2:
        return None
    return ref, cand


def _mark_input_independent(cases: List[Any], results: List[Dict[str, Any]], rows: List[Dict[str, Any]]) -> None:
    """Mark ``vacuous`` the rows of an output that is the same for every golden sample, in the reference and in
    the candidate alike (a model that ignores its input): agreement there says nothing about the model, even
    where the values differ between the output's elements."""
    names = set(str(r.get("output")) for r in rows if r.get("sample") is not None)
    for name in names:
        stacked = _stacked(name, [(pair, got) for (_, _, pair), got in zip(cases, results)])
        if stacked is None:
            continue
        ref, cand = stacked
        if np.ptp(ref, axis=0).max() == 0 and np.ptp(cand, axis=0).max() == 0:
            for r in rows:
                if r.get("output") == name and r.get("sample") is not None:
                    r["vacuous"] = True
                    r["vacuous_why"] = "the same output for every input sample"


# a candidate whose outputs vary across the judged samples by less than this share of PyTorch's does not follow
# its input (a collapsed quantization grid, a dead branch): near-constant values can sit close to a reference
# that shares a large offset (probabilities near 0.87), where a cosine per sample stays above 0.9999
MIN_SPREAD_SHARE = 0.1


def ignored_input(cases: List[Any], results: List[Dict[str, Any]], precision: str, real: bool) -> List[Dict[str, Any]]:
    """One failing row per output whose candidate values barely change across the goldens that judge agreement
    (spread under :data:`MIN_SPREAD_SHARE` of PyTorch's, root mean square about each element's mean) while
    PyTorch's do: the candidate does not follow its input, however close its values sit."""
    judged = [(pair, got) for (point, _, pair), got in zip(cases, results) if judges_agreement(point, precision, real)]
    names = sorted(set(n for pair, got in judged for n in pair["out"] if n in got))
    out = []  # type: List[Dict[str, Any]]
    for name in names:
        stacked = _stacked(name, judged)
        if stacked is None:
            continue
        ref, cand = stacked
        if not (np.isfinite(ref).all() and np.isfinite(cand).all()):
            continue  # non-finite values fail on their own
        ref_spread = float(np.sqrt(np.mean((ref - ref.mean(axis=0)) ** 2)))
        cand_spread = float(np.sqrt(np.mean((cand - cand.mean(axis=0)) ** 2)))
        if ref_spread <= NEAR_ZERO_RMS or cand_spread >= MIN_SPREAD_SHARE * ref_spread:
            continue
        why = (
            "ignores input: its {} varies across {} samples by {:.3g} (root mean square), PyTorch's by {:.3g}: "
            "the artifact does not follow its input".format(name, ref.shape[0], cand_spread, ref_spread)
        )
        out.append(pooled_row("input_dependence", name, real, passed=False, failure=["ignores input"], reason=why))
    return out


def vacuous_verdict(rows: List[Dict[str, Any]], real: bool = False) -> List[Dict[str, Any]]:
    """One failing row when every row that judges agreement is ``vacuous``: the reference and the candidate give
    constant outputs whatever the input, so their agreement proves nothing about the model (a dead or unloaded
    model, all-zero weights). Empty otherwise."""
    judged = [r for r in rows if r.get("sample") is not None and r.get("agreement_judged")]
    if len(judged) < 2 or not all(r.get("vacuous") for r in judged):
        return []
    outputs = sorted(set(str(r.get("output")) for r in judged))
    why = (
        "vacuous: every compared output is constant, in PyTorch and here, whatever the input ({} rows): "
        "agreement proves nothing about the model".format(len(judged))
    )
    return [pooled_row("vacuous", ", ".join(outputs), real, passed=False, failure=["vacuous"], reason=why)]


def pooled_row(check: str, output: str, real: bool, **figures: Any) -> Dict[str, Any]:
    """A row judged over many goldens (``sample`` None): over the real-sample ones (``shape`` "real"), or over
    every golden ("all")."""
    row = {"check": check, "shape": "real" if real else "all", "sample": None, "output": output}  # type: Dict[str, Any]
    row.update(figures)
    return row


def sparse_values(full: np.ndarray, stride: int, count: int) -> np.ndarray:
    """The elements of ``full`` a sparingly stored golden keeps: every ``stride``-th of the flat array, ``count``
    of them."""
    return np.ascontiguousarray(full).reshape(-1)[:: int(stride)][: int(count)]


def where(row: Dict[str, Any]) -> str:
    """How reports name a comparison row: ``shape#sample``, or ``shape (pooled)`` for a pooled row."""
    sample = row.get("sample")
    if sample is None:
        return "{} (pooled)".format(row.get("shape"))
    kind = "real sample " if row.get("shape") in REAL_DATA_POINTS else ""
    return "{}{}#{}".format(kind, row.get("shape"), sample)


def pooled_top1(rows: List[Dict[str, Any]], min_topk_agreement: Optional[float]) -> List[Dict[str, Any]]:
    """One row per classifier output: top-1 agreement pooled over the real-sample goldens, judged (and per
    integer output: the share of its values exactly equal, the same decision counted the same way).

    ``rows`` are :func:`compare_output` rows with ``shape`` (the golden's point) and ``output`` set. The pool
    is the rows of the real-sample points (``REAL_DATA_POINTS``); when no golden comes from real data, every row. Rows
    without a top-1 figure (not classifier outputs) are ignored. None when ``min_topk_agreement`` is None.
    """
    if min_topk_agreement is None:
        return []
    real = [r for r in rows if r.get("shape") in REAL_DATA_POINTS and "top1_agreement" in r]
    pool = real or [r for r in rows if "top1_agreement" in r]
    totals = {}  # type: Dict[str, List[float]]
    integer = set(r["output"] for r in pool if r.get("integer"))  # exact agreement of integer values
    for r in pool:
        n = int(r.get("top1_rows", 1))
        agree_total = totals.setdefault(r["output"], [0.0, 0.0])
        agree_total[0] += float(r["top1_agreement"]) * n
        agree_total[1] += n
    out = []
    for name in sorted(totals):
        agree, total = totals[name]
        top1 = agree / total if total else 1.0
        upper = top1_upper_bound(top1, int(total))
        row = pooled_row(
            TOP1_CHECK, name, bool(real), top1_agreement=top1, top1_upper_bound=upper, rows=int(total),
            passed=upper >= min_topk_agreement,
        )  # fmt: skip
        if name in integer:
            row["integer"] = True
        if not row["passed"]:
            where = "real samples" if real else "goldens (no real-sample goldens)"
            where = "integer values of " + where if name in integer else where
            row["failure"] = [LOW_TOPK]
            row["reason"] = (
                "{}: {} agreement {:.4f} ({} of {} {}; at most {:.4f} within one standard error) < {}".format(
                    LOW_TOPK,
                    "exact" if name in integer else "top-1",
                    top1,
                    int(round(agree)),
                    int(total),
                    where,
                    upper,
                    min_topk_agreement,
                )
            )
        out.append(row)
    return out


def top1_upper_bound(agreement: float, samples: int, z: float = TOP1_SAMPLING_Z) -> float:
    """Upper end of the Wilson score interval of a top-1 agreement counted on ``samples`` samples.

    The pooled top-1 check passes when this reaches the target: the count is not more than ``z`` standard
    errors below it. Wilson's interval, not the normal one, because at agreements near 1 the normal interval
    collapses to zero width. No samples: 1.0 (nothing to judge).
    """
    if samples <= 0:
        return 1.0
    p, n, z2 = float(agreement), float(samples), z * z
    centre = p + z2 / (2 * n)
    spread = z * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return float(min(1.0, (centre + spread) / (1 + z2 / n)))


def batch_consistency(
    outputs: Dict[str, np.ndarray],
    batch: int,
    *,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    min_cosine: Optional[float] = None,
    batch_major: Optional[Collection[str]] = None,
) -> List[Dict[str, Any]]:
    """Check that a batch made of one row repeated gave the same output in every row.

    ``outputs`` are the candidate's outputs for that batch; every output whose leading axis is
    ``batch`` is checked (row 0 is the reference for the others) with the candidate's own tolerance.
    Outputs without that leading axis are reported as skipped, and so are those not in ``batch_major``
    (when given: the outputs whose leading axis was seen to follow the batch size).
    """
    rows = []
    for name, arr in outputs.items():
        if arr.ndim == 0 or arr.shape[0] != batch:
            rows.append({"output": name, "passed": True, "skipped": "leading axis is not the batch axis"})
            continue
        if batch_major is not None and name not in batch_major:
            why = "leading axis does not follow the batch size (its length is the batch's only here)"
            rows.append({"output": name, "passed": True, "skipped": why})
            continue
        first = np.broadcast_to(arr[:1], arr.shape)
        row = compare_output(first, arr, atol=atol, rtol=rtol, min_cosine=min_cosine)
        row["vacuous"] = False  # the rows are one sample repeated: their being equal is the point, not vacuous
        if not np.isfinite(arr[:1].astype(np.float64)).all() and row["passed"]:
            row.update(passed=False, failure=[NON_FINITE], reason="{}: in row 0".format(NON_FINITE))
        row["output"] = name
        row["rows"] = batch
        rows.append(row)
    return rows
