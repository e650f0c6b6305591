"""What every training data source produces (:class:`Splits`) and the checks and helpers they share:
label encoding, channel-last detection, stratified held-out splits."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from edgedeploy.errors import InputError


@dataclass
class Splits:
    """Train and held-out sets plus what the checkpoint metadata needs to know about the inputs.

    ``inputs`` (sidecar input specs) is filled by sources with several or non-float inputs; when
    empty the single float input is described by ``sample_shape`` and ``value_range``.
    ``train_batches`` bounds an epoch of a streaming (iterable) train set.
    """

    train: Dataset
    test: Dataset
    sample_shape: tuple[int, ...]
    num_classes: int
    class_names: list[str]
    normalization: dict[str, Any] = field(default_factory=dict)
    value_range: tuple[float, float] = (0.0, 1.0)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    train_samples: int | None = None
    calibration: dict[str, np.ndarray] = field(default_factory=dict)  # a few training inputs, by input name
    validation: dict[str, np.ndarray] = field(default_factory=dict)  # held-out inputs, by input name
    provenance: dict[str, Any] = field(default_factory=dict)


def encode_labels(y: np.ndarray, yt: np.ndarray | None, where: str) -> tuple[np.ndarray, np.ndarray | None, list[str]]:
    """Integer class ids for ``y`` (and ``yt``); string labels become ids in sorted order.

    Returns:
        ``(y, yt, names)``; ``names`` is empty for integer labels.

    Raises:
        InputError: labels that are neither integers (or integral floats) nor strings.
    """
    both = [a for a in (y, yt) if a is not None]
    if all(a.dtype.kind in "US" for a in both):
        names = sorted({str(v) for a in both for v in a.tolist()})
        index = {n: i for i, n in enumerate(names)}
        enc = [np.asarray([index[str(v)] for v in a.tolist()], dtype=np.int64) for a in both]
        return enc[0], (enc[1] if yt is not None else None), names
    for a in both:
        if a.dtype.kind == "f" and not np.all(np.isfinite(a) & (a == np.round(a))):
            raise InputError(f"training data {where}: labels are non-integer floats", hint="labels must be class ids")
        if a.dtype.kind not in "biuf":
            raise InputError(
                f"training data {where}: labels have dtype {a.dtype}", hint="use integer class ids or strings"
            )
        if a.size and a.min() < 0:
            raise InputError(f"training data {where}: negative label {int(a.min())}", hint="class ids start at 0")
    return y.astype(np.int64), (yt.astype(np.int64) if yt is not None else None), []


def to_nchw(x: np.ndarray, layout: str, where: str) -> np.ndarray:
    """Image batches as (N, C, H, W): ``NHWC`` is transposed; ``auto`` refuses arrays that look channel-last.

    Raises:
        InputError: non-numeric values, or an ``auto`` layout whose last axis looks like channels.
    """
    if x.dtype.kind not in "biuf":
        raise InputError(f"training data {where}: x has dtype {x.dtype}, not numbers", hint="save x as float32")
    if x.ndim != 4:
        return x
    if layout == "NHWC":
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    if layout == "auto" and x.shape[-1] in (1, 3, 4) and x.shape[1] not in (1, 3, 4):
        raise InputError(
            f"training data {where}: x {tuple(x.shape)} looks channel-last (N, H, W, C)",
            hint="set data.layout = 'NHWC' to transpose it, or 'NCHW' if it really is channel-first",
        )
    return x


def stratified_test_indices(y: np.ndarray, fraction: float, seed: int) -> list[int]:
    """Indices of a stratified held-out set: ``fraction`` of each class (at least one sample)."""
    rng = np.random.default_rng(seed)
    test_idx: list[int] = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        test_idx.extend(int(i) for i in idx[: max(1, round(len(idx) * fraction))])
    return sorted(test_idx)


def outward_range(lo: float, hi: float) -> tuple[float, float]:
    """``[lo, hi]`` rounded outward to 4 decimals, so the recorded range covers the data."""
    return math.floor(lo * 1e4) / 1e4, math.ceil(hi * 1e4) / 1e4
