"""Datasets for ``deploy train``: digits (scikit-learn, offline) and .npz arrays here; image folders,
WebDataset shards, text files and user callables in :mod:`edgedeploy.train.sources`.

Every source ends as :class:`Splits`: train and held-out ``Dataset``s plus what the checkpoint sidecar
needs to know about the model's inputs (names, shapes, dtypes, value ranges, normalisation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from edgedeploy.errors import ConfigError, InputError
from edgedeploy.train.config import TrainConfig


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


def _digits() -> tuple[np.ndarray, np.ndarray, list[str]]:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ConfigError("data.dataset = 'digits' needs scikit-learn", hint="pip install 'edgedeploy[data]'") from None
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8) in [0, 1]
    return x, d.target.astype(np.int64), [str(n) for n in d.target_names]


def _npz(cfg: TrainConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    path = cfg.path(cfg.data.path)
    assert path is not None  # checked by the config
    if not path.is_file():
        raise InputError(f"training data not found: {path}", hint="fix data.path in the train config")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise InputError(
                f"training data {path} holds Python-object arrays, which are never unpickled",
                hint="save labels as integers or fixed-width strings (numpy.str_), images as numbers",
            ) from None
        raise InputError(f"training data {path} is not a readable .npz ({exc})") from None
    except OSError as exc:
        raise InputError(f"training data {path} is not a readable .npz ({exc})") from None
    for key in ("x", "y"):
        if key not in arrays:
            raise InputError(f"training data {path} has no array {key!r}", hint="save arrays named x and y")
    return arrays["x"], arrays["y"], arrays.get("x_test"), arrays.get("y_test")


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


def _split(x: np.ndarray, y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    """Stratified split: every class keeps ``fraction`` of its samples for the held-out set."""
    test_idx = stratified_test_indices(y, fraction, seed)
    mask = np.zeros(len(y), dtype=bool)
    mask[test_idx] = True
    return x[~mask], y[~mask], x[mask], y[mask]


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


def load_splits(cfg: TrainConfig) -> Splits:
    """Load the configured data, split it, and normalise arrays per channel with train-set statistics.

    Raises:
        InputError: missing or unreadable data, bad shapes, layouts, dtypes or labels (one line each).
        ConfigError: a source's settings do not fit together.
    """
    if cfg.data.dataset not in ("digits", "npz"):
        from edgedeploy.train import sources

        return sources.load(cfg)
    if cfg.data.dataset == "digits":
        x, y, names = _digits()
        xt = yt = None
    else:
        x, y, xt, yt = _npz(cfg)
        where = str(cfg.path(cfg.data.path))
        x = to_nchw(x, cfg.data.layout, where)
        xt = None if xt is None else to_nchw(xt, cfg.data.layout, where)
        y, yt, names = encode_labels(y, yt, where)
    if x.ndim < 2 or len(x) != len(y) or y.ndim != 1:
        raise InputError(f"training data: x {x.shape} and y {y.shape} must be (N, ...) and (N,)")
    if xt is None or yt is None:
        x, y, xt, yt = _split(x, y, cfg.data.test_fraction, cfg.data.split_seed)
    x, xt = x.astype(np.float32), xt.astype(np.float32)
    y, yt = y.astype(np.int64), yt.astype(np.int64)
    num_classes = max(int(max(y.max(), yt.max())) + 1, len(names))
    normalization: dict[str, Any] = {}
    if cfg.data.normalize:
        axes = tuple(i for i in range(x.ndim) if i != 1) if x.ndim > 2 else (0,)
        mean, std = x.mean(axis=axes), x.std(axis=axes) + 1e-6
        shape = (1, -1) + (1,) * (x.ndim - 2)
        x = (x - mean.reshape(shape)) / std.reshape(shape)
        xt = (xt - mean.reshape(shape)) / std.reshape(shape)
        normalization = {"mean": [float(v) for v in np.atleast_1d(mean)], "std": [float(v) for v in np.atleast_1d(std)]}
    lo, hi = float(min(x.min(), xt.min())), float(max(x.max(), xt.max()))
    return Splits(
        train=TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
        test=TensorDataset(torch.from_numpy(xt), torch.from_numpy(yt)),
        sample_shape=tuple(int(d) for d in x.shape[1:]),
        num_classes=num_classes,
        class_names=list(cfg.deploy.class_names) or names or [str(i) for i in range(num_classes)],
        normalization=normalization,
        value_range=outward_range(lo, hi),
    )
