"""Judging a reduced-precision model on data it was not calibrated on.

Calibration batches are split (``edgedeploy.precision.data.split_heldout``): the last quarter is held out and
never used for ranges, smoothing or sensitivity; the candidate is scored sample by sample against the FP32
model on those (cosine similarity of each sample's output, or top-1 agreement for classifier outputs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# the default target for a similarity output (each held-out sample's cosine vs FP32, mean)
COSINE_TARGET = 0.99
# the default target for a classifier output when no top-1 tolerance is set: the gate's INT8 default
TOP1_TARGET = 0.95
# corner crops of held-out images judged besides the image itself and its mirror image
VIEW_CROP = 0.8
# the smaller crops (four corners and the centre each) of the precision stage's wider judge, after VIEW_CROP's
JUDGE_CROPS = (0.8, 0.65, 0.5)
# views of each held-out photo that go into goldens.npz (so into the bundle), and the cap on their samples
GOLDEN_VIEWS = 6
MAX_VIEWED_SAMPLES = 96
HALF_MAX = 65504.0  # the largest finite float16: a view beyond it stays float32
# the precision stage judges candidates on more views than the goldens carry: top-1 agreement on 96 views of
# 16 photos did not rank INT8 candidates at all (Spearman -0.03 against 3,000 crops), on 512 views it did
# (0.72), and the expected agreement below on those better (0.90); bench/int8_cnn_judge.json
JUDGE_VIEWS = 32
MAX_JUDGED_SAMPLES = 512


def held_out_score(
    reference: Sequence[dict[str, np.ndarray]],
    candidate: Sequence[dict[str, np.ndarray]],
    classifier_outputs: Sequence[str] = (),
) -> dict[str, Any]:
    """Agreement of ``candidate`` with ``reference`` sample by sample.

    Classifier outputs: top-1 agreement, the lower of the observed fraction and
    :func:`expected_top1_agreement` (both reported). Integer outputs: the share of values exactly equal.
    Others: cosine similarity of each sample's output (mean is the score; min and 5th percentile reported).
    ``score`` is the worst output's.
    """
    per_output: dict[str, dict[str, Any]] = {}
    for name in reference[0]:
        raw = np.concatenate([r[name] for r in reference])
        ref = raw.astype(np.float64)
        cand = np.concatenate([c[name] for c in candidate]).astype(np.float64)
        if not np.isfinite(cand).all():
            per_output[name] = {"metric": "cosine", "value": 0.0, "nonfinite": True}
            continue
        if raw.dtype.kind in "biu":  # class ids, a label map: the values agree or they do not
            agree = float(np.mean(ref == cand)) if ref.size else 1.0
            per_output[name] = {"metric": "top1_agreement", "value": agree, "compared": "integer values, exactly"}
            continue
        if name in classifier_outputs:
            agree = float(np.mean(ref.argmax(-1) == cand.argmax(-1)))
            per_output[name] = {"metric": "top1_agreement", **top1_score(agree, ref, cand)}
            continue
        per_output[name] = cosine_score(ref, cand)
    worst = min(per_output.values(), key=lambda r: r["value"])
    return {"score": worst["value"], "metric": worst["metric"], "samples": int(len(ref)), "outputs": per_output}


# the held-out batches are judged in this many steps; after each, whether the target is still reachable
JUDGED_STEPS = 8


def held_out_until_decided(
    run: Callable[[Sequence[dict[str, np.ndarray]]], list[dict[str, np.ndarray]]],
    reference: Sequence[dict[str, np.ndarray]],
    batches: Sequence[dict[str, np.ndarray]],
    classifier_outputs: Sequence[str],
    target: float,
) -> tuple[dict[str, Any], int, list[dict[str, np.ndarray]]]:
    """(:func:`held_out_score` of the candidate on the batches judged, how many batches were judged, its outputs on
    them), ``run`` giving the candidate's outputs for a list of batches (``reference``: the float model's on
    ``batches``).

    The batches are judged in :data:`JUDGED_STEPS` steps, and the judging stops early only when some output can no
    longer meet ``target`` whatever the rest would show (:class:`ReachableScore`: every sample left agreeing
    exactly); its score is then that of the batches judged. A candidate that can still meet the target is judged
    on every batch, so a passing verdict is always the whole judge's.

    Raises:
        StageError: ONNX Runtime cannot run the model (from ``run``).
    """
    names = list(reference[0]) if reference else []
    reachable = [ReachableScore(reference, name, classifier_outputs) for name in names]
    size = max(1, -(-len(batches) // JUDGED_STEPS))
    outputs: list[dict[str, np.ndarray]] = []
    for first in range(0, len(batches), size):
        last = min(first + size, len(batches))
        part = run(batches[first:last])
        outputs.extend(part)
        if last == len(batches):
            break
        best = [r.add(reference[first:last], part) for r in reachable]  # every output takes in this step
        # a hair under: the verdict sums in another order. Each output's score on the batches judged is at most
        # its bound (what is lost counts against fewer samples), so the partial score misses the target too
        if min(best, default=1.0) < target - 1e-9:
            return held_out_score(reference[:last], outputs, classifier_outputs), last, outputs
    return held_out_score(reference, outputs, classifier_outputs), len(batches), outputs


class ReachableScore:
    """The highest :func:`held_out_score` one output can still reach once some batches are judged, the rest unseen:
    every value, row or sample left agreeing exactly. Exact, never an estimate: an integer output's share of equal
    values, a classifier's top-1 agreement (its score is never above the observed share) and the mean of each
    sample's cosine each count what is lost so far against all there are. A non-finite value scores 0. An output
    too short for a cosine per sample (one pooled cosine) or whose reference is (near) zero everywhere is not
    bounded."""

    def __init__(self, reference: Sequence[dict[str, np.ndarray]], name: str, classifier_outputs: Sequence[str]):
        from edgedeploy.validate.parity import MIN_COSINE_ELEMENTS

        self.name = name
        first = np.asarray(reference[0][name]) if reference else np.zeros(0)
        if first.dtype.kind in "biu":
            self.kind = "equal"
            self.total = sum(int(np.asarray(r[name]).size) for r in reference)
        elif name in classifier_outputs:
            self.kind = "top1"
            self.total = sum(int(np.asarray(r[name]).size) // max(first.shape[-1], 1) for r in reference)
        elif first.ndim >= 1 and first[:1].size >= MIN_COSINE_ELEMENTS:
            self.kind = "cosine"
            self.total = sum(int(defined_samples(_rows(np.asarray(r[name]))).sum()) for r in reference)
        else:
            self.kind, self.total = "pooled", 0
        self.lost = 0.0

    def add(self, reference: Sequence[dict[str, np.ndarray]], candidate: Sequence[dict[str, np.ndarray]]) -> float:
        """Take in the next judged batches; return the highest score still reachable (1.0 where not bounded)."""
        for r, c in zip(reference, candidate):
            ref, cand = np.asarray(r[self.name]), np.asarray(c[self.name], np.float64)
            if not np.isfinite(cand).all():
                return 0.0  # scored 0 whatever the rest shows
            if self.kind == "pooled" or self.total == 0 or ref.shape != cand.shape:
                return 1.0  # not bounded (a shape mismatch: the verdict names it)
            ref64 = ref.astype(np.float64)
            if self.kind == "equal":
                self.lost += float((ref64 != cand).sum())
            elif self.kind == "top1":
                flat = ref.shape[-1]
                self.lost += float((ref64.reshape(-1, flat).argmax(-1) != cand.reshape(-1, flat).argmax(-1)).sum())
            else:
                rows, got = _rows(ref64), _rows(cand)
                defined = defined_samples(rows)
                self.lost += float((1.0 - sample_cosines(rows[defined], got[defined])).sum())
        return 1.0 - self.lost / self.total if self.total else 1.0


def _rows(values: np.ndarray) -> np.ndarray:
    return values.reshape(values.shape[0], -1)


def cosine_score(ref: np.ndarray, cand: np.ndarray) -> dict[str, Any]:
    """Mean cosine of each sample's output (min and 5th percentile reported), over the samples where it is
    defined (:func:`edgedeploy.validate.parity.cosine_undefined_why`: three elements or more, a reference not
    near zero). An output of fewer elements per sample (a score, a speech/no-speech probability) is judged by
    one cosine over all samples' values together, about the reference's mean (``pooled``:
    :func:`edgedeploy.validate.parity.centred_cosine`, as validation pools such outputs); none defined at all:
    ``value`` 1.0, ``n/a``.
    """
    from edgedeploy.validate.parity import MIN_COSINE_ELEMENTS, centred_cosine

    r, c = _rows(ref), _rows(cand)
    if r.shape[1] < MIN_COSINE_ELEMENTS:
        pooled = centred_cosine(r.ravel(), c.ravel())
        if pooled is None:
            return {"metric": "cosine", "value": 1.0, "n/a": "too few or (near) zero values to compare"}
        return {"metric": "cosine", "value": pooled, "min": pooled, "p5": pooled, "pooled": True}
    defined = defined_samples(r)
    if not defined.any():
        return {"metric": "cosine", "value": 1.0, "n/a": "every reference sample is (near) zero"}
    cos = sample_cosines(r[defined], c[defined])
    row = {"metric": "cosine", "value": float(cos.mean()), "min": float(cos.min()), "p5": float(np.percentile(cos, 5))}
    if not defined.all():
        row["undefined_samples"] = int((~defined).sum())
    return row


def defined_samples(rows: np.ndarray) -> np.ndarray:
    """Which samples (``rows``: one flattened sample a row) have a cosine: a reference not (near) zero."""
    from edgedeploy.validate.parity import NEAR_ZERO_RMS

    return np.sqrt((rows.astype(np.float64) ** 2).mean(axis=1)) >= NEAR_ZERO_RMS


def sample_cosines(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """Each row's cosine of ``cand`` with ``ref`` (0 where either is all zero)."""
    denom = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    return np.where(denom > 0, (ref * cand).sum(axis=1) / np.maximum(denom, 1e-30), 0.0)


def top1_score(observed: float, reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """``value``: the lower of the ``observed`` top-1 agreement and :func:`expected_top1_agreement` (the count is
    what the gate checks, the estimate ranks candidates where a hundred samples' count cannot); both reported."""
    expected = expected_top1_agreement(reference, candidate)
    return {"value": min(observed, expected), "observed": observed, "expected": expected}


def expected_top1_agreement(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Top-1 agreement the candidate is expected to have on samples like these, from how far each sample's
    top-1 leads its runner-up and how much the candidate moves such leads: the mean of
    :func:`top1_keep_probabilities`.

    Far less noisy than counting flips on a hundred samples, where one flip is a percent; flips to a third
    class are not modelled. ``reference`` and ``candidate``: (samples, ..., classes) scores.
    """
    return float(np.mean(top1_keep_probabilities(reference, candidate)))


def top1_keep_probabilities(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Each sample's probability of keeping the reference's top-1 class in the candidate.

    A sample flips when the candidate shrinks the lead of the reference's top-1 over its runner-up by more than
    the lead. The change of that lead is taken as normal around zero with the root mean square change over
    these samples as its standard deviation (a systematic shrink counts as spread), so each sample counts by how
    close it is to flipping rather than as a 0 or 1.
    """
    import torch

    lead, moved = top1_lead_changes(reference, candidate)
    sigma = float(np.sqrt(np.mean(moved**2))) if len(moved) else 0.0
    if sigma == 0.0 or not len(lead):
        return np.ones(len(lead))
    return torch.special.ndtr(torch.from_numpy(lead / sigma)).numpy()  # P(the lead survives)


def top1_lead_changes(reference: np.ndarray, candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lead, change): per sample, how far the reference's top-1 leads its runner-up, and how much the
    candidate changes that lead (negative: shrinks it). No runner-up (one class): an infinite lead."""
    r = reference.reshape(-1, reference.shape[-1]).astype(np.float64)
    c = candidate.reshape(-1, candidate.shape[-1]).astype(np.float64)
    if r.shape[-1] < 2:
        return np.full(len(r), np.inf), np.zeros(len(r))
    order = np.argsort(r, axis=1)
    rows = np.arange(len(r))
    top, second = order[:, -1], order[:, -2]
    lead = r[rows, top] - r[rows, second]
    return lead, (c[rows, top] - c[rows, second]) - lead


def resolution_hint(metric: str, samples: int, target: float) -> str:
    """A hint suffix when top-1 agreement on ``samples`` held-out samples cannot resolve ``target``: agreement
    moves in steps of 1/N, so with N < 1 / (1 - target) a single flip already misses it."""
    if metric != "top1_agreement" or not 0 < samples < 1 / max(1 - target, 1e-9):
        return ""
    return (
        f"; judged on {samples} held-out samples, one disagreement costs {1 / samples:.1%}: give more samples "
        "(precision.calib_samples, a quarter is held out) or validate.data to judge on more"
    )


def accuracy_target_for(
    setting: float | None,
    outputs: Sequence[str],
    classifier_outputs: Sequence[str],
    top1_tolerance: float | None,
) -> tuple[float, str]:
    """(target, why) the held-out score must reach: ``setting`` when given, else by what is judged.

    The default asks of the search what the release gate asks of the artifact: top-1 agreement at the gate's
    ``tolerance.<precision>.min_topk_agreement`` when every output is a classifier output (a cosine of 0.99 is a
    small shift, one top-1 flip in a hundred is a stricter test than the gate applies), cosine ``COSINE_TARGET``
    otherwise, and the stricter of the two when a model has both kinds (the score is the worst output's).
    """
    if setting is not None:
        return float(setting), "precision.accuracy_target"
    top1 = TOP1_TARGET if top1_tolerance is None else float(top1_tolerance)
    judged_top1 = [o for o in outputs if o in classifier_outputs]
    if judged_top1 and len(judged_top1) == len(outputs):
        return top1, "default for classifier outputs: the gate's top-1 agreement (tolerance min_topk_agreement)"
    if judged_top1:
        return max(top1, COSINE_TARGET), "default for mixed outputs: the stricter of top-1 agreement and cosine"
    return COSINE_TARGET, "default for non-classifier outputs: mean cosine vs FP32"


def heldout_views(
    batches: Sequence[dict[str, np.ndarray]],
    layout: str,
    max_samples: int = MAX_VIEWED_SAMPLES,
    max_views: int = GOLDEN_VIEWS,
    *,
    half_grid: bool = False,
) -> list[dict[str, np.ndarray]]:
    """Views of each held-out image batch: the image, its mirror image and its four corner crops (``VIEW_CROP``
    of each side, resized back), then (``max_views`` above 6) the centre crop and the corner and centre crops
    at each smaller ``JUDGE_CROPS`` fraction, then the mirror images of all those crops: up to 32 views.

    As many views as keep the total within ``max_samples`` (at least the batches themselves); the first six are
    the goldens' views. ``half_grid`` (INT8 builds): float32 views are rounded to float16 values
    (:func:`on_half_grid`). The views are of held-out images only, never of calibration ones. Batches whose
    single input is not a 4-D float image (``layout`` NCHW or NHWC) are returned as they are.
    """
    import torch

    samples = sum(len(next(iter(b.values()))) for b in batches)
    count = min(max_views, max(1, max_samples // max(samples, 1)))
    views: list[dict[str, np.ndarray]] = []
    for batch in batches:
        (name, x), *rest = batch.items()
        if rest or x.ndim != 4 or x.dtype.kind != "f":
            return list(batches)
        t = torch.from_numpy(np.ascontiguousarray(x if layout == "NCHW" else x.transpose(0, 3, 1, 2)))
        corners_and_centre = _crops(t, VIEW_CROP)
        chosen = [t, torch.flip(t, dims=[3]), *corners_and_centre[:4]]
        if count > len(chosen):
            more = corners_and_centre[4:] + [c for frac in JUDGE_CROPS[1:] for c in _crops(t, frac)]
            firsts = chosen[2:] + more
            chosen += more + [torch.flip(c, dims=[3]) for c in firsts]
        for v in chosen[:count]:
            v = v.to(t.dtype)
            a = (on_half_grid(v) if half_grid else v).numpy()
            views.append({name: np.ascontiguousarray(a if layout == "NCHW" else a.transpose(0, 2, 3, 1))})
    return views


def on_half_grid(view: Any) -> Any:
    """A float32 image view (a torch tensor) rounded to the nearest float16 values, so goldens.npz stores it
    exactly in half the bytes (``half`` entries); unchanged when a value lies outside float16's range or is not a
    number, or the view is not float32.

    A photo carries 8 bits per channel and a float16 11 significant bits: the rounding moves each value by
    under 0.05 % of itself, and every check compares the candidate with the reference on the same rounded view.
    INT8 builds only: an INT8 model quantizes its input to 8 bits (or, in a float prefix, computes on it as the
    reference does), but an FP16 model's own error includes rounding its input to float16, which a view already
    on that grid would hide from its judge.
    """
    import torch

    # a NaN anywhere makes the comparison false: such a view is kept as it is
    if view.dtype != torch.float32 or view.numel() == 0 or not bool(view.abs().amax() <= HALF_MAX):
        return view
    return view.to(torch.float16).to(torch.float32)


def _crops(t: Any, frac: float) -> list[Any]:
    """The four corner crops and the centre crop of ``frac`` of each side of NCHW tensor ``t``, resized back."""
    import torch.nn.functional as F

    h, w = t.shape[2:]
    ch, cw = max(1, round(h * frac)), max(1, round(w * frac))
    at = [(y, x0) for y in (0, h - ch) for x0 in (0, w - cw)] + [((h - ch) // 2, (w - cw) // 2)]
    crops = [t[:, :, y : y + ch, x0 : x0 + cw].float() for y, x0 in at]
    return [F.interpolate(c, size=(h, w), mode="bilinear", align_corners=False) for c in crops]
