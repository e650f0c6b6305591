"""The one-pass calibration histogram: a zero-anchored grid whose width doubles as batches widen the span."""

from __future__ import annotations

import numpy as np

from edgedeploy.precision import histogram


def _one_pass(batches: list[np.ndarray]) -> histogram.TensorHistogram:
    running = histogram._ZeroAnchored()
    for b in batches:
        running.add(b)
    return running.finish()


def test_growing_batches_give_the_exact_counts_of_all_values_on_the_final_grid() -> None:
    rng = np.random.default_rng(0)
    # each batch reaches further out, so the width doubles several times after the first batch set it
    batches = [rng.normal(0.2, s, 3000).astype(np.float32) for s in (0.01, 0.1, 1.0, 7.0)]
    h = _one_pass(batches)
    values = np.concatenate(batches).astype(np.float64)
    assert (h.lo, h.hi) == (float(values.min()), float(values.max()))
    assert h.edges[0] == h.lo and h.edges[-1] == h.hi and np.all(np.diff(h.edges) > 0)
    # interior edges are multiples of one width: each value's bin by that grid, counted exactly
    width = h.edges[2] - h.edges[1]
    exact = np.bincount(np.floor(values / width).astype(np.int64) - int(round(h.edges[1] / width)) + 1)
    assert h.counts.sum() == len(values)
    np.testing.assert_array_equal(h.counts, exact[: len(h.counts)])
    assert len(h.counts) >= histogram.SIDE_BINS // 2  # the span keeps at least half a side's resolution
    # magnitudes: every value once, up to the largest magnitude
    assert h.abs_counts.sum() == len(values) and h.abs_edges[-1] == max(-h.lo, h.hi)


def test_a_large_tensor_is_histogrammed_by_a_strided_subset_that_keeps_its_shape_and_extremes() -> None:
    rng = np.random.default_rng(1)
    big = np.clip(rng.laplace(0.5, 0.4, (8, 96, 56, 56)), -3, 6).astype(np.float32)  # 2.4M values
    big.reshape(-1)[123_457] = 9.5  # one outlier the subset skips: still the span's end
    h = _one_pass(list(big))  # batches of one sample, as calibration runs
    assert h.hi == 9.5 and h.lo == float(big.min())
    assert abs(h.counts.sum() - big.size) < 0.01 * big.size  # each sampled value counts for its stride
    full = histogram.TensorHistogram.of(big)
    ours = histogram.choose_ranges({"t": h}, "percentile")["t"]
    exact = histogram.choose_ranges({"t": full}, "percentile")["t"]
    assert np.abs(np.subtract(ours, exact)).max() < 0.01 * (big.max() - big.min())
    # mse: the range chosen from the subset costs the full tensor about what the exact histogram's range does
    sample = big.reshape(-1)[::7].astype(np.float64)
    ours_error = _uint8_error(sample, *histogram.choose_ranges({"t": h}, "mse")["t"])
    exact_error = _uint8_error(sample, *histogram.choose_ranges({"t": full}, "mse")["t"])
    assert ours_error < 1.03 * exact_error
    assert ours_error < 0.5 * _uint8_error(sample, h.lo, h.hi)  # and it is not min/max


def _uint8_error(values: np.ndarray, lo: float, hi: float) -> float:
    scale = (hi - lo) / 255
    zero = np.round(-lo / scale)
    return float(np.mean((values - (np.clip(np.round(values / scale) + zero, 0, 255) - zero) * scale) ** 2))


def test_all_zero_and_nonfinite_values() -> None:
    zeros = _one_pass([np.zeros(10, np.float32), np.zeros(5, np.float32)])
    assert (zeros.lo, zeros.hi) == (0.0, 0.0) and zeros.counts.sum() == 15
    assert histogram.choose_ranges({"z": zeros}, "mse")["z"] == (0.0, 0.0)
    # zeros first, then a span: the zeros land in the bin at zero
    later = _one_pass([np.zeros(10, np.float32), np.array([-1.0, 0.5, 2.0], np.float32)])
    assert later.counts.sum() == 13 and later.counts[np.searchsorted(later.edges, 0.0, side="right") - 1] >= 10
    nan = _one_pass([np.array([np.nan, 1.0, -2.0, np.inf], np.float32)])
    assert (nan.lo, nan.hi) == (-2.0, 1.0) and nan.counts.sum() == 2
