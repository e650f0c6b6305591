"""The ``mse`` calibration method: the activation range with the least INT8 error (rounding plus clipping)."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy.precision import histogram


def _hist(values: np.ndarray) -> histogram.TensorHistogram:
    return histogram.TensorHistogram.of(values)


def _int8_error(values: np.ndarray, lo: float, hi: float, symmetric: bool) -> float:
    """Mean squared error of fake-quantizing ``values`` as onnxruntime / TensorRT do with range [lo, hi]."""
    if symmetric:
        scale = max(abs(lo), abs(hi)) / 127
        q = np.clip(np.round(values / scale), -127, 127) * scale
    else:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        scale = (hi - lo) / 255
        zero = np.round(-lo / scale)
        q = (np.clip(np.round(values / scale) + zero, 0, 255) - zero) * scale
    return float(np.mean((values - q) ** 2))


@pytest.mark.parametrize("symmetric", [False, True])
def test_mse_range_beats_min_max_and_its_neighbours_on_a_long_tail(symmetric: bool) -> None:
    rng = np.random.default_rng(0)
    values = rng.laplace(0.5, 0.4, 50_000)  # a sharp peak with long thin tails, as conv outputs have
    h = _hist(values)
    lo, hi = histogram.mse_range(h, symmetric)
    assert lo <= 0.0 <= hi
    chosen = _int8_error(values, lo, hi, symmetric)
    assert chosen < 0.95 * _int8_error(values, h.lo, h.hi, symmetric)  # min/max spends the grid on the tails
    for factor in (0.7, 0.85, 1.2, 1.5):  # a narrower or wider range is no better (histogram-bin accuracy)
        assert chosen <= _int8_error(values, lo * factor, hi * factor, symmetric) * 1.02
    assert hi < h.hi and (symmetric or lo > h.lo)  # the tails are clipped


def test_mse_range_keeps_a_bounded_uniform_span_and_zero() -> None:
    rng = np.random.default_rng(1)
    values = rng.uniform(0.5, 3.0, 100_000)  # all positive: zero must still be on the grid
    lo, hi = histogram.mse_range(_hist(values))
    assert lo <= 0.0 and hi > 0.98 * values.max()
    relu6 = np.clip(rng.normal(2.0, 2.0, 100_000), 0.0, 6.0)
    lo, hi = histogram.mse_range(_hist(relu6))
    assert lo == 0.0 and hi > 5.5  # 6 itself is heavily populated: clipping there costs more than rounding


def test_choose_ranges_mse_follows_the_activation_symmetry() -> None:
    rng = np.random.default_rng(2)
    values = np.r_[rng.normal(-1.0, 0.3, 50_000), rng.normal(4.0, 0.2, 2000)]
    hists = {"t": _hist(values), "logits": _hist(values)}
    asym = histogram.choose_ranges(hists, "mse", exact=["logits"])
    sym = histogram.choose_ranges(hists, "mse", exact=["logits"], symmetric=True)
    assert asym["t"] != sym["t"] and asym["logits"] == sym["logits"] == (hists["t"].lo, hists["t"].hi)
    assert asym["t"] != histogram.choose_ranges(hists, "minmax")["t"]
