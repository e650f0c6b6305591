"""Datasets for ``deploy train``: digits (scikit-learn, offline) and .npz arrays here; image folders,
WebDataset shards, text files and user callables in :mod:`edgedeploy.train.sources`.

Every source ends as :class:`Splits`: train and held-out ``Dataset``s plus what the checkpoint sidecar
needs to know about the model's inputs (names, shapes, dtypes, value ranges, normalisation).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from edgedeploy.errors import ConfigError, InputError
from edgedeploy.train.config import TrainConfig
from edgedeploy.train.splits import Splits, encode_labels, outward_range, stratified_test_indices, to_nchw

__all__ = ["Splits", "encode_labels", "load_splits", "outward_range", "stratified_test_indices", "to_nchw"]


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


def _split(x: np.ndarray, y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    """Stratified split: every class keeps ``fraction`` of its samples for the held-out set."""
    test_idx = stratified_test_indices(y, fraction, seed)
    mask = np.zeros(len(y), dtype=bool)
    mask[test_idx] = True
    return x[~mask], y[~mask], x[mask], y[mask]


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
