"""Activation ranges for INT8 from histograms collected here, so the calibration methods really differ.

onnxruntime.quantization's ``Entropy`` calibrator gives ranges byte-identical to ``MinMax`` on real CNNs
(onnxruntime 1.32, EfficientNet-Lite0 on photo crops: the same QDQ model), and its ``Percentile`` differs by
a hair. Here every float tensor of the FP32 model is observed on the calibration batches (two passes:
min/max, then a histogram over that span), and the range is chosen per method:

- ``minmax``: the observed min and max;
- ``percentile``: the 0.01 % / 99.99 % quantiles (two-sided), so a few outliers do not set the scale;
- ``entropy``: TensorRT's KL-divergence threshold on the |x| histogram (the clip value whose 128-level
  quantized distribution diverges least from the observed one), applied to both signs;
- ``mse``: the range whose INT8 grid gives the least expected squared error, rounding inside it plus clipping
  outside it (the L2 search of PyTorch's ``HistogramObserver`` and NVIDIA's pytorch-quantization ``mse``),
  on the signed histogram for asymmetric activations (255 steps) or on |x| for symmetric ones (127 steps).

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
MSE_STRIDE = 4  # the MSE search tries every 4th bin edge per side (512 x 512 candidate ranges at 2048 bins)


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


def _clip_and_round_error(
    counts: np.ndarray, centers: np.ndarray, edges: np.ndarray, lo_idx: np.ndarray, hi_idx: np.ndarray, steps: int
) -> np.ndarray:
    """Expected squared INT8 error of every candidate range ``[edges[lo_idx], edges[hi_idx]]`` (broadcast):
    values inside round onto ``steps`` uniform steps (error step^2 / 12 each), values outside clip to the
    nearer end. Prefix sums of count, count * x and count * x^2 make each candidate O(1)."""
    c = counts.astype(np.float64)
    s0 = np.concatenate([[0.0], np.cumsum(c)])
    s1 = np.concatenate([[0.0], np.cumsum(c * centers)])
    s2 = np.concatenate([[0.0], np.cumsum(c * centers**2)])
    a, b = edges[lo_idx], edges[hi_idx]
    below = a**2 * s0[lo_idx] - 2 * a * s1[lo_idx] + s2[lo_idx]  # bins left of a, clipped up to a
    n0, n1, n2 = s0[-1] - s0[hi_idx], s1[-1] - s1[hi_idx], s2[-1] - s2[hi_idx]
    above = b**2 * n0 - 2 * b * n1 + n2  # bins right of b, clipped down to b
    # the grid always spans zero (the quantizer widens the range to include it)
    inside = (s0[hi_idx] - s0[lo_idx]) * ((np.maximum(b, 0.0) - np.minimum(a, 0.0)) / steps) ** 2 / 12.0
    return below + above + inside


def mse_range(h: TensorHistogram, symmetric: bool = False) -> tuple[float, float]:
    """(lo, hi) minimizing the expected squared INT8 error of the observed values (rounding plus clipping).

    Asymmetric (uint8, ONNX Runtime's activations): both ends searched on the signed histogram, 255 steps.
    Symmetric (int8, TensorRT): the threshold ``t`` searched on the |x| histogram, 127 steps on each side;
    returned as the observed span clipped to ``[-t, t]``. Zero stays inside the range either way.
    """
    if symmetric:
        if h.absmax <= 0 or h.abs_counts.sum() == 0:
            return h.lo, h.hi
        edges = np.linspace(0.0, h.absmax, BINS + 1)
        centers = (edges[:-1] + edges[1:]) / 2
        hi_idx = np.arange(MSE_STRIDE, BINS + 1, MSE_STRIDE)
        err = _clip_and_round_error(h.abs_counts, centers, edges, np.zeros_like(hi_idx), hi_idx, 127)
        t = float(edges[hi_idx[int(np.argmin(err))]])
        return max(h.lo, -t), min(h.hi, t)
    if h.hi <= h.lo or h.counts.sum() == 0:
        return h.lo, h.hi
    edges = h.edges()
    centers = (edges[:-1] + edges[1:]) / 2
    zero = int(np.clip(np.searchsorted(edges, 0.0), 0, BINS))  # the range keeps zero: lo <= 0 <= hi
    los = np.unique(np.r_[np.arange(0, zero + 1, MSE_STRIDE), zero])
    his = np.unique(np.r_[np.arange(BINS, zero - 1, -MSE_STRIDE), max(zero, 1)])
    lo_idx, hi_idx = np.meshgrid(los, his[his > 0], indexing="ij")
    ok = hi_idx > lo_idx
    err = np.where(ok, _clip_and_round_error(h.counts, centers, edges, lo_idx, hi_idx, 255), np.inf)
    i, j = np.unravel_index(int(np.argmin(err)), err.shape)
    return min(float(edges[lo_idx[i, j]]), 0.0), max(float(edges[hi_idx[i, j]]), 0.0)


def choose_ranges(
    hists: dict[str, TensorHistogram], method: str, exact: Sequence[str] = (), symmetric: bool = False
) -> dict[str, tuple[float, float]]:
    """Tensor name -> (lo, hi) for ``method`` (``minmax``, ``percentile``, ``entropy`` or ``mse``).

    ``exact`` tensors (the graph outputs) always keep min/max: clipping a model output flattens its largest
    values into ties, which turns a classifier's arg-max into noise. ``symmetric``: the activations are
    quantized symmetrically (TensorRT), which ``mse`` searches for.
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
        elif method == "mse":
            out[name] = mse_range(h, symmetric)
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
