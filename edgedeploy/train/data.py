"""Datasets for ``deploy train``: scikit-learn's bundled digits (offline) or arrays from an .npz file."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from edgedeploy.errors import ConfigError, InputError
from edgedeploy.train.config import TrainConfig


@dataclass
class Splits:
    """Train and held-out sets plus what the checkpoint metadata needs to know about the inputs."""

    train: TensorDataset
    test: TensorDataset
    sample_shape: tuple[int, ...]
    num_classes: int
    class_names: list[str]
    normalization: dict[str, Any] = field(default_factory=dict)
    value_range: tuple[float, float] = (0.0, 1.0)


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
    except (OSError, ValueError) as exc:
        raise InputError(f"training data {path} is not a readable .npz ({exc})") from None
    for key in ("x", "y"):
        if key not in arrays:
            raise InputError(f"training data {path} has no array {key!r}", hint="save arrays named x and y")
    return arrays["x"], arrays["y"], arrays.get("x_test"), arrays.get("y_test")


def _split(x: np.ndarray, y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    """Stratified split: every class keeps ``fraction`` of its samples for the held-out set."""
    rng = np.random.default_rng(seed)
    test_idx: list[int] = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        test_idx.extend(idx[: max(1, round(len(idx) * fraction))])
    mask = np.zeros(len(y), dtype=bool)
    mask[test_idx] = True
    return x[~mask], y[~mask], x[mask], y[mask]


def load_splits(cfg: TrainConfig) -> Splits:
    """Load the configured data, split it, and normalise it per channel with train-set statistics.

    Raises:
        InputError: the npz file is missing, unreadable or lacks arrays; arrays have bad shapes.
    """
    if cfg.data.dataset == "digits":
        x, y, names = _digits()
        xt = yt = None
    else:
        x, y, xt, yt = _npz(cfg)
        names = []
    if x.ndim < 2 or len(x) != len(y) or y.ndim != 1:
        raise InputError(f"training data: x {x.shape} and y {y.shape} must be (N, ...) and (N,)")
    if xt is None or yt is None:
        x, y, xt, yt = _split(x, y, cfg.data.test_fraction, cfg.data.split_seed)
    x, xt = x.astype(np.float32), xt.astype(np.float32)
    y, yt = y.astype(np.int64), yt.astype(np.int64)
    num_classes = int(max(y.max(), yt.max())) + 1
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
        value_range=(math.floor(lo * 1e4) / 1e4, math.ceil(hi * 1e4) / 1e4),  # outward: covers the data
    )
