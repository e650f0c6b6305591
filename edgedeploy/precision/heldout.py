"""Judging a reduced-precision model on data it was not calibrated on.

Calibration batches are split (``edgedeploy.precision.data.split_heldout``): the last quarter is held out and
never used for ranges, smoothing or sensitivity; the candidate is scored sample by sample against the FP32
model on those (cosine similarity of each sample's output, or top-1 agreement for classifier outputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# the default target for a similarity output (each held-out sample's cosine vs FP32, mean)
COSINE_TARGET = 0.99
# the default target for a classifier output when no top-1 tolerance is set: the gate's INT8 default
TOP1_TARGET = 0.95
# corner crops of held-out images judged besides the image itself and its mirror image
VIEW_CROP = 0.8
# views stop multiplying past this many judged samples (they also go into goldens.npz, so into the bundle)
MAX_VIEWED_SAMPLES = 96


def held_out_score(
    reference: Sequence[dict[str, np.ndarray]],
    candidate: Sequence[dict[str, np.ndarray]],
    classifier_outputs: Sequence[str] = (),
) -> dict[str, Any]:
    """Agreement of ``candidate`` with ``reference`` sample by sample.

    Classifier outputs: top-1 agreement. Others: cosine similarity of each sample's output (mean is the
    score; min and 5th percentile reported). ``score`` is the worst output's.
    """
    per_output: dict[str, dict[str, Any]] = {}
    for name in reference[0]:
        ref = np.concatenate([r[name] for r in reference]).astype(np.float64)
        cand = np.concatenate([c[name] for c in candidate]).astype(np.float64)
        if not np.isfinite(cand).all():
            per_output[name] = {"metric": "cosine", "value": 0.0, "nonfinite": True}
            continue
        if name in classifier_outputs:
            agree = float(np.mean(ref.argmax(-1) == cand.argmax(-1)))
            per_output[name] = {"metric": "top1_agreement", "value": agree}
            continue
        r = ref.reshape(ref.shape[0], -1)
        c = cand.reshape(cand.shape[0], -1)
        denom = np.linalg.norm(r, axis=1) * np.linalg.norm(c, axis=1)
        cos = np.where(denom > 0, (r * c).sum(axis=1) / np.maximum(denom, 1e-30), 1.0)
        per_output[name] = {
            "metric": "cosine",
            "value": float(cos.mean()),
            "min": float(cos.min()),
            "p5": float(np.percentile(cos, 5)),
        }
    worst = min(per_output.values(), key=lambda r: r["value"])
    return {"score": worst["value"], "metric": worst["metric"], "samples": int(len(ref)), "outputs": per_output}


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
    batches: Sequence[dict[str, np.ndarray]], layout: str, max_samples: int = MAX_VIEWED_SAMPLES
) -> list[dict[str, np.ndarray]]:
    """Each held-out image batch, its mirror image and its four corner crops (``VIEW_CROP`` of each side,
    resized back): up to six views of every held-out photo, so top-1 agreement moves in finer steps.

    As many views as keep the total within ``max_samples`` (at least the batches themselves). The views are of
    held-out images only, never of calibration ones. Batches whose single input is not a 4-D float image
    (``layout`` NCHW or NHWC) are returned as they are.
    """
    import torch
    import torch.nn.functional as F

    samples = sum(len(next(iter(b.values()))) for b in batches)
    count = min(6, max(1, max_samples // max(samples, 1)))
    views: list[dict[str, np.ndarray]] = []
    for batch in batches:
        (name, x), *rest = batch.items()
        if rest or x.ndim != 4 or x.dtype.kind != "f":
            return list(batches)
        t = torch.from_numpy(np.ascontiguousarray(x if layout == "NCHW" else x.transpose(0, 3, 1, 2)))
        h, w = t.shape[2:]
        ch, cw = max(1, round(h * VIEW_CROP)), max(1, round(w * VIEW_CROP))
        corners = [t[:, :, y : y + ch, x0 : x0 + cw] for y in (0, h - ch) for x0 in (0, w - cw)]
        resized = [F.interpolate(c.float(), size=(h, w), mode="bilinear", align_corners=False) for c in corners]
        for v in [t, torch.flip(t, dims=[3]), *resized][:count]:
            a = v.to(t.dtype).numpy()
            views.append({name: np.ascontiguousarray(a if layout == "NCHW" else a.transpose(0, 2, 3, 1))})
    return views
