"""Activation ranges for INT8 from histograms collected here, so the calibration methods really differ.

onnxruntime.quantization's ``Entropy`` calibrator gives ranges byte-identical to ``MinMax`` on real CNNs
(onnxruntime 1.32, EfficientNet-Lite0 on photo crops: the same QDQ model), and its ``Percentile`` differs by
a hair. Here every float tensor of the FP32 model is observed on the calibration batches in one pass (a
histogram whose bin width doubles as the span grows, large tensors by an evenly strided subset), and the
range is chosen per method:

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BINS = 2048  # bins of an exact histogram over [lo, hi] (TensorHistogram.of)
SIDE_BINS = 2048  # bins on each side of zero while collecting (the width doubles as the span grows)
SAMPLED_VALUES = 1 << 15  # values per tensor per batch whose bulk enters the histogram by a strided subset
TAIL_SHARE = 0.002  # each tail of a large tensor counted value by value: beyond the subset's 0.2 / 99.8 % quantiles
THRESHOLD_SAMPLE = 1 << 12  # values of the subset the tail quantiles are taken from
PERCENTILE = 99.99
ENTROPY_LEVELS = 128  # quantized bins of the KL search (int8 magnitude levels)
MSE_CANDIDATES = 512  # candidate range ends per side of the MSE search (every k-th bin edge)


@dataclass
class TensorHistogram:
    """One tensor's observed span and its histograms: signed values over ``edges`` (first edge ``lo``, last
    ``hi``) and magnitudes over ``abs_edges`` (from 0 to ``absmax``)."""

    lo: float
    hi: float
    edges: np.ndarray
    counts: np.ndarray
    abs_edges: np.ndarray
    abs_counts: np.ndarray

    @property
    def absmax(self) -> float:
        return max(abs(self.lo), abs(self.hi))

    @classmethod
    def of(cls, values: np.ndarray, bins: int = BINS) -> TensorHistogram:
        """The exact histograms of ``values`` (finite), ``bins`` uniform bins over each span."""
        values = np.asarray(values, dtype=np.float64).ravel()
        lo, hi = float(values.min()), float(values.max())
        top = max(abs(lo), abs(hi))
        counts, edges = np.histogram(values, bins=bins, range=(lo, hi) if hi > lo else (lo, lo + 1.0))
        abs_counts, abs_edges = np.histogram(np.abs(values), bins=bins, range=(0.0, top if top > 0 else 1.0))
        return cls(lo, hi, edges, counts.astype(np.float64), abs_edges, abs_counts.astype(np.float64))


class _ZeroAnchored:
    """Running counts of one tensor in ``2 * SIDE_BINS`` bins of one width whose edges are multiples of it
    (``[-SIDE_BINS * width, SIDE_BINS * width)``): when a batch reaches past the span, the width doubles and
    neighbouring bins merge exactly, so one pass over the batches suffices (no first pass for the span).

    Tensors larger than :data:`SAMPLED_VALUES` enter the histogram by an evenly strided subset, each value
    counted for the ones it stands for, except in the tails (:data:`TAIL_SHARE` each side), where every value
    counts; every value sets ``lo`` and ``hi``.
    """

    def __init__(self) -> None:
        self.lo, self.hi, self.width = np.inf, -np.inf, 0.0
        self.counts = np.zeros(2 * SIDE_BINS)
        self.zeros = 0.0  # values counted before any nonzero one set the width (all of them zero)

    def add(self, v: np.ndarray) -> None:
        flat = v.reshape(-1)
        if flat.size > SAMPLED_VALUES and self.width > 0.0 and self._add_strided(flat):
            return
        lo, hi = float(v.min()), float(v.max())
        if not (np.isfinite(lo) and np.isfinite(hi)):  # NaN or inf somewhere (rare): only finite values count
            v = v[np.isfinite(v)]
            if not v.size:
                return
            lo, hi = float(v.min()), float(v.max())
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        top = max(-self.lo, self.hi)
        flat = v.reshape(-1)  # v may have lost its non-finite values above
        if top == 0.0:
            self.zeros += flat.size
            return
        if self.width == 0.0:
            self.width = top / (SIDE_BINS - 0.5)
        while top >= SIDE_BINS * self.width:
            merged = self.counts.reshape(-1, 2).sum(axis=1)
            self.counts = np.zeros(2 * SIDE_BINS)
            self.counts[SIDE_BINS // 2 : SIDE_BINS // 2 + SIDE_BINS] = merged
            self.width *= 2.0
        if flat.size <= SAMPLED_VALUES:
            self._count(flat, 1.0)
            return
        self._count_strided(*self._split(flat))

    @staticmethod
    def _split(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """(subset, tails, stride): the bulk by an evenly strided subset, each value to be counted for its
        stride; the tails (where the ranges are decided, and where a subset is noisiest) value by value: those
        beyond the subset's :data:`TAIL_SHARE` quantiles."""
        stride = flat.size // SAMPLED_VALUES | 1  # odd: not in step with a power-of-two row length
        subset = flat[stride // 2 :: stride]
        # the thresholds from a smaller subset still (selection is the costly step): any threshold keeps the
        # counts unbiased, it only moves the line between values counted one by one and values counted by stride
        sample = subset[:: max(1, subset.size // THRESHOLD_SAMPLE)].copy()
        k_lo = int(TAIL_SHARE * (sample.size - 1))
        k_hi = sample.size - 1 - k_lo
        sample.partition((k_lo, k_hi))
        t_lo, t_hi = sample[k_lo], sample[k_hi]
        return subset[(subset >= t_lo) & (subset <= t_hi)], flat[(flat < t_lo) | (flat > t_hi)], stride

    def _count_strided(self, bulk: np.ndarray, tails: np.ndarray, stride: int) -> None:
        self._count(bulk, float(stride))
        self._count(tails, 1.0)

    def _add_strided(self, flat: np.ndarray) -> bool:
        """:meth:`add` for a large tensor in fewer passes over it: its min and max are those of the strided
        subset and the tails together (every value outside the subset's tail quantiles is in the tails, so
        the extremes are exact). False, with nothing counted, where a value is not finite or the span grows
        past the bins (the general path handles both)."""
        bulk, tails, stride = self._split(flat)
        if not bulk.size:  # a NaN among the quantiles
            return False
        lo, hi = float(bulk.min()), float(bulk.max())
        if tails.size:
            lo, hi = min(lo, float(tails.min())), max(hi, float(tails.max()))
        if not (np.isfinite(lo) and np.isfinite(hi)) or max(-lo, hi) >= SIDE_BINS * self.width:
            return False
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        self._count_strided(bulk, tails, stride)
        return True

    def _count(self, values: np.ndarray, weight: float) -> None:
        index = np.floor(values / np.float32(self.width)).astype(np.int64) + SIDE_BINS
        np.clip(index, 0, 2 * SIDE_BINS - 1, out=index)
        self.counts += np.bincount(index, minlength=2 * SIDE_BINS) * weight

    def finish(self) -> TensorHistogram:
        """The span's histograms: signed over the bins from ``lo``'s to ``hi``'s, magnitudes up to ``absmax``."""
        counts = self.counts.copy()
        if self.width == 0.0:  # every value was zero
            one = np.array([self.zeros])
            return TensorHistogram(0.0, 0.0, np.array([0.0, 0.0]), one, np.array([0.0, 0.0]), one)
        counts[SIDE_BINS] += self.zeros
        first = int(np.clip(np.floor(self.lo / self.width), -SIDE_BINS, SIDE_BINS - 1)) + SIDE_BINS
        last = int(np.clip(np.floor(self.hi / self.width), -SIDE_BINS, SIDE_BINS - 1)) + SIDE_BINS
        edges = (np.arange(first, last + 2) - SIDE_BINS) * self.width
        edges[0], edges[-1] = self.lo, self.hi
        magnitudes = counts[SIDE_BINS:] + counts[:SIDE_BINS][::-1]  # [jw, (j+1)w) with (-(j+1)w, -jw]
        top = max(-self.lo, self.hi)
        n_abs = min(int(np.floor(top / self.width)) + 1, SIDE_BINS)
        abs_edges = np.arange(n_abs + 1) * self.width
        abs_edges[-1] = top
        return TensorHistogram(self.lo, self.hi, edges, counts[first : last + 1], abs_edges, magnitudes[:n_abs])


def collect(
    model_path: Path,
    batches: Sequence[dict[str, np.ndarray]],
    workdir: Path,
    observe: Callable[[int, dict[str, np.ndarray]], None] | None = None,
) -> dict[str, TensorHistogram]:
    """Histograms of every float tensor of ``model_path`` (inputs, intermediates, outputs) over ``batches``, in
    one pass of the model with ONNX Runtime's graph optimizations on (every tensor is a graph output there, so
    each keeps its name and value). ``observe(i, values)``, when given, also sees batch ``i``'s tensors (the
    same pass serves another measurement of the float model)."""
    from edgedeploy.precision.analysis import intermediates

    running: dict[str, _ZeroAnchored] = {}
    for i, values in enumerate(intermediates(model_path, batches, workdir, optimize=True)):
        if observe is not None:
            observe(i, values)
        for name, v in values.items():
            if v.dtype.kind == "f" and v.size:
                running.setdefault(name, _ZeroAnchored()).add(v)
    return {name: r.finish() for name, r in running.items() if np.isfinite(r.lo)}


def percentile_range(h: TensorHistogram, pct: float = PERCENTILE) -> tuple[float, float]:
    """(lo, hi) quantiles ``100 - pct`` and ``pct`` from the histogram (bin edges, so never past min/max)."""
    total = h.counts.sum()
    if total == 0 or h.hi <= h.lo:
        return h.lo, h.hi
    cdf = np.cumsum(h.counts) / total
    edges = h.edges
    lo = edges[int(np.searchsorted(cdf, (100.0 - pct) / 100.0))]
    hi = edges[min(int(np.searchsorted(cdf, pct / 100.0)) + 1, len(h.counts))]
    return float(min(lo, 0.0) if h.lo <= 0 else lo), float(max(hi, 0.0) if h.hi >= 0 else hi)


def entropy_threshold(abs_counts: np.ndarray, abs_edges: np.ndarray, levels: int = ENTROPY_LEVELS) -> float:
    """TensorRT's entropy calibration: the clip value ``t`` minimizing KL(P || Q), P the |x| histogram clipped
    at ``t`` (outliers added to the last bin), Q that histogram merged into ``levels`` bins and expanded back.
    ``abs_edges``: the bin edges of ``abs_counts``, from 0 to the largest magnitude."""
    hist = abs_counts.astype(np.float64)
    hist[0] = 0.0  # exact zeros (ReLU's dead half) would dominate the divergence and pull the threshold to 0
    n = len(hist)
    absmax = float(abs_edges[-1])
    if hist.sum() == 0 or absmax <= 0:
        return absmax
    best_i, best_kl = n, np.inf
    for i in range(levels, n + 1, 16):  # every 16th candidate: the curve is smooth at a thousand bins
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
    return float(abs_edges[best_i])


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
        edges = h.abs_edges
        centers = (edges[:-1] + edges[1:]) / 2
        n = len(h.abs_counts)
        stride = max(1, n // MSE_CANDIDATES)
        hi_idx = np.unique(np.r_[np.arange(stride, n + 1, stride), n])
        err = _clip_and_round_error(h.abs_counts, centers, edges, np.zeros_like(hi_idx), hi_idx, 127)
        t = float(edges[hi_idx[int(np.argmin(err))]])
        return max(h.lo, -t), min(h.hi, t)
    if h.hi <= h.lo or h.counts.sum() == 0:
        return h.lo, h.hi
    edges = h.edges
    centers = (edges[:-1] + edges[1:]) / 2
    n = len(h.counts)
    stride = max(1, n // MSE_CANDIDATES)
    zero = int(np.clip(np.searchsorted(edges, 0.0), 0, n))  # the range keeps zero: lo <= 0 <= hi
    los = np.unique(np.r_[np.arange(0, zero + 1, stride), zero])
    his = np.unique(np.r_[np.arange(n, zero - 1, -stride), max(zero, 1)])
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
            t = entropy_threshold(h.abs_counts, h.abs_edges)
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
