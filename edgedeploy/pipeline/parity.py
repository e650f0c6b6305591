"""Numerical comparison of a candidate's outputs with the reference's (numpy only, no torch).

Kept free of torch and of newer-Python syntax so the device-side bundle step can use it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def compare_output(
    ref: np.ndarray,
    cand: np.ndarray,
    *,
    atol: float | None,
    rtol: float | None,
    min_cosine: float | None,
    min_topk_agreement: float | None = None,
    topk: int = 1,
    classifier: bool = False,
) -> dict[str, Any]:
    """Error figures for one output and whether they pass the tolerance.

    The elementwise check is ``|cand - ref| <= atol + rtol * |ref|`` (numpy.allclose's rule);
    NaN or Inf in the candidate where the reference is finite never passes.
    """
    row: dict[str, Any] = {"shape_ref": list(ref.shape), "shape_cand": list(cand.shape)}
    if ref.shape != cand.shape:
        row.update(passed=False, reason=f"shape {list(cand.shape)} != reference {list(ref.shape)}")
        return row
    r = ref.astype(np.float64)
    c = cand.astype(np.float64)
    nan = int(np.isnan(c).sum())
    inf = int(np.isinf(c).sum())
    row.update(nan=nan, inf=inf)
    reasons = []
    if nan or inf:
        reasons.append(f"candidate has {nan} NaN and {inf} Inf values")
    finite = np.isfinite(c) & np.isfinite(r)
    diff = np.abs(c - r)[finite]
    rel = (diff / np.maximum(np.abs(r[finite]), 1e-12)) if diff.size else diff
    row["max_abs"] = float(diff.max()) if diff.size else 0.0
    row["p99_abs"] = float(np.percentile(diff, 99)) if diff.size else 0.0
    row["max_rel"] = float(rel.max()) if rel.size else 0.0
    row["p99_rel"] = float(np.percentile(rel, 99)) if rel.size else 0.0
    rf, cf = r[finite].ravel(), c[finite].ravel()
    denom = float(np.linalg.norm(rf) * np.linalg.norm(cf))
    row["cosine"] = float(rf @ cf / denom) if denom > 0 else (1.0 if np.array_equal(rf, cf) else 0.0)
    if atol is not None or rtol is not None:
        a = atol or 0.0
        t = rtol or 0.0
        ok = np.abs(c - r) <= a + t * np.abs(r)
        if not bool(ok.all()):
            worst = int(np.argmax(np.where(np.isfinite(c), np.abs(c - r) - t * np.abs(r), np.inf)))
            reasons.append(
                f"{int((~ok).sum())} of {ok.size} values outside atol={a:g} rtol={t:g} "
                f"(worst at flat index {worst}: ref {r.ravel()[worst]:.6g}, got {c.ravel()[worst]:.6g})"
            )
    if min_cosine is not None and row["cosine"] < min_cosine:
        reasons.append(f"cosine {row['cosine']:.6f} < {min_cosine}")
    if classifier and ref.ndim >= 2:
        k = min(topk, ref.shape[-1])
        ref_top = np.argsort(-r.reshape(-1, ref.shape[-1]), axis=-1)[:, :k]
        cand_top = np.argsort(-np.nan_to_num(c, nan=-np.inf).reshape(-1, ref.shape[-1]), axis=-1)[:, :k]
        top1 = float((ref_top[:, 0] == cand_top[:, 0]).mean())
        row["top1_agreement"] = top1
        row[f"top{k}_overlap"] = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ref_top, cand_top)]))
        if min_topk_agreement is not None and top1 < min_topk_agreement:
            reasons.append(f"top-1 agreement {top1:.4f} < {min_topk_agreement}")
    row["passed"] = not reasons
    if reasons:
        row["reason"] = "; ".join(reasons)
    return row
