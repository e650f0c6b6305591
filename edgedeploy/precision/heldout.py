"""Judging a reduced-precision model on data it was not calibrated on.

Calibration batches are split: every 4th is held out and never used for ranges, smoothing or sensitivity; the
candidate is scored sample by sample against the FP32 model on those (cosine similarity of each sample's
output, or top-1 agreement for classifier outputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def split_held_out(batches: Sequence[Any], every: int = 4) -> tuple[list[Any], list[Any]]:
    """(calibration, held-out) batches: every ``every``-th batch is held out, never calibrated on.

    With fewer than 2 batches nothing can be held out: both lists are the input (the caller reports it).
    """
    if len(batches) < 2:
        return list(batches), list(batches)
    held = [b for i, b in enumerate(batches) if i % every == every - 1] or [batches[-1]]
    calib = [b for b in batches if not any(b is h for h in held)]
    return calib, held


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
