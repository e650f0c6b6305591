"""Activation ranges for INT8 from histograms collected here, so the calibration methods really differ.

onnxruntime.quantization's ``Entropy`` calibrator gives ranges byte-identical to ``MinMax`` on real CNNs
(onnxruntime 1.32, EfficientNet-Lite0 on photo crops: the same QDQ model), and its ``Percentile`` differs by
a hair. Here every float tensor of the FP32 model is observed on the calibration batches (two passes:
min/max, then a histogram over that span), and the range is chosen per method:

- ``minmax``: the observed min and max;
- ``percentile``: the 0.01 % / 99.99 % quantiles (two-sided), so a few outliers do not set the scale;
- ``entropy``: TensorRT's KL-divergence threshold on the |x| histogram (the clip value whose 128-level
  quantized distribution diverges least from the observed one), applied to both signs.

The ranges are written as ONNX Runtime's calibration cache (``TensorsData``), which ``quantize_static`` reads
instead of calibrating again, so the QDQ model is still made by onnxruntime.quantization.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BINS = 2048
PERCENTILE = 99.99
ENTROPY_LEVELS = 128  # quantized bins of the KL search (int8 magnitude levels)


@dataclass
class TensorHistogram:
    """Two-pass statistics of one tensor: span, then a histogram over it."""

    lo: float = np.inf
    hi: float = -np.inf
    counts: np.ndarray = field(default_factory=lambda: np.zeros(BINS, dtype=np.int64))
    abs_counts: np.ndarray = field(default_factory=lambda: np.zeros(BINS, dtype=np.int64))

    def edges(self) -> np.ndarray:
        return np.linspace(self.lo, self.hi, BINS + 1)

    @property
    def absmax(self) -> float:
        return max(abs(self.lo), abs(self.hi))


def collect(model_path: Path, batches: Sequence[dict[str, np.ndarray]], workdir: Path) -> dict[str, TensorHistogram]:
    """Histograms of every float tensor of ``model_path`` (inputs, intermediates, outputs) over ``batches``."""
    from edgedeploy.precision.analysis import intermediates

    hists: dict[str, TensorHistogram] = {}
    for values in intermediates(model_path, batches, workdir):
        for name, v in values.items():
            if v.dtype.kind != "f" or not v.size:
                continue
            v = v[np.isfinite(v)]
            if v.size:
                span = hists.setdefault(name, TensorHistogram())
                span.lo, span.hi = min(span.lo, float(v.min())), max(span.hi, float(v.max()))
    for values in intermediates(model_path, batches, workdir):
        for name, v in values.items():
            h = hists.get(name)
            if h is None or v.dtype.kind != "f":
                continue
            v = v[np.isfinite(v)].astype(np.float64)
            if h.hi > h.lo:
                h.counts += np.histogram(v, bins=BINS, range=(h.lo, h.hi))[0]
            if h.absmax > 0:
                h.abs_counts += np.histogram(np.abs(v), bins=BINS, range=(0.0, h.absmax))[0]
    return hists


def percentile_range(h: TensorHistogram, pct: float = PERCENTILE) -> tuple[float, float]:
    """(lo, hi) quantiles ``100 - pct`` and ``pct`` from the histogram (bin edges, so never past min/max)."""
    total = h.counts.sum()
    if total == 0 or h.hi <= h.lo:
        return h.lo, h.hi
    cdf = np.cumsum(h.counts) / total
    edges = h.edges()
    lo = edges[int(np.searchsorted(cdf, (100.0 - pct) / 100.0))]
    hi = edges[min(int(np.searchsorted(cdf, pct / 100.0)) + 1, BINS)]
    return float(min(lo, 0.0) if h.lo <= 0 else lo), float(max(hi, 0.0) if h.hi >= 0 else hi)


def entropy_threshold(abs_counts: np.ndarray, absmax: float, levels: int = ENTROPY_LEVELS) -> float:
    """TensorRT's entropy calibration: the clip value ``t`` minimizing KL(P || Q), P the |x| histogram clipped
    at ``t`` (outliers added to the last bin), Q that histogram merged into ``levels`` bins and expanded back."""
    hist = abs_counts.astype(np.float64)
    hist[0] = 0.0  # exact zeros (ReLU's dead half) would dominate the divergence and pull the threshold to 0
    n = len(hist)
    if hist.sum() == 0 or absmax <= 0:
        return absmax
    best_i, best_kl = n, np.inf
    for i in range(levels, n + 1, 16):  # every 16th candidate: the curve is smooth at 2048 bins
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()
        nonzero = p > 0
        # Q: each of ``levels`` chunks (np.array_split's sizes) spreads its mass over its non-empty bins
        sizes = np.full(levels, i // levels)
        sizes[: i % levels] += 1
        chunk_of = np.repeat(np.arange(levels), sizes)
        mass = np.bincount(chunk_of, weights=hist[:i], minlength=levels)
        filled = np.bincount(chunk_of, weights=nonzero.astype(np.float64), minlength=levels)
        q = np.where(nonzero, (mass / np.maximum(filled, 1.0))[chunk_of], 0.0)
        p_n, q_n = p / p.sum(), q / max(q.sum(), 1e-12)
        mask = (p_n > 0) & (q_n > 0)
        kl = float(np.sum(p_n[mask] * np.log(p_n[mask] / q_n[mask]))) + float(np.sum(p_n[(p_n > 0) & (q_n == 0)]))
        if kl < best_kl:
            best_i, best_kl = i, kl
    return absmax * best_i / n


def choose_ranges(
    hists: dict[str, TensorHistogram], method: str, exact: Sequence[str] = ()
) -> dict[str, tuple[float, float]]:
    """Tensor name -> (lo, hi) for ``method`` (``minmax``, ``percentile`` or ``entropy``).

    ``exact`` tensors (the graph outputs) always keep min/max: clipping a model output flattens its largest
    values into ties, which turns a classifier's arg-max into noise.
    """
    out = {}
    keep = set(exact)
    for name, h in hists.items():
        if not np.isfinite(h.lo):
            continue
        if name in keep:
            out[name] = (h.lo, h.hi)
        elif method == "percentile":
            out[name] = percentile_range(h)
        elif method == "entropy":
            t = entropy_threshold(h.abs_counts, h.absmax)
            out[name] = (max(h.lo, -t), min(h.hi, t))
        else:
            out[name] = (h.lo, h.hi)
        lo, hi = out[name]
        out[name] = (min(float(lo), 0.0), max(float(hi), 0.0))  # zero must be representable
    return out


def write_ort_cache(ranges: dict[str, tuple[float, float]], path: Path) -> Path:
    """Write ``ranges`` as onnxruntime.quantization's calibration cache (read by ``calibration_cache_path``)."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData, save_tensors_data

    data = {k: (np.float32(lo), np.float32(hi)) for k, (lo, hi) in ranges.items()}
    save_tensors_data(TensorsData(CalibrationMethod.MinMax, data), path)
    return path
