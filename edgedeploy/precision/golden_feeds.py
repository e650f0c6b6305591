"""The inputs goldens.npz holds and their reference outputs, whatever computes them (PyTorch, or ONNX Runtime
FP32 for a model given as ONNX): seeded inputs at min / opt / max, ``validate.data`` (else one calibration
batch), and for FP16 / INT8 builds calibrated on a folder or callable the held-out calibration batches.

Every later comparison (ONNX Runtime here, TensorRT on the device) reads goldens.npz, so validation needs
neither torch nor the source model once the goldens exist.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.config import DeployConfig
from edgedeploy.errors import InputError, StageError
from edgedeploy.modelio.goldens import store_goldens
from edgedeploy.modelio.inputs import SHAPE_POINTS, check_feeds, feeds_at
from edgedeploy.precision.data import HELDOUT_POINT

Feeds = dict[str, np.ndarray]


def golden_arrays(cfg: DeployConfig, outputs: Callable[[Feeds], Feeds]) -> tuple[Feeds, dict[str, Any]]:
    """(goldens.npz arrays, metrics) with ``outputs(feeds)`` as the reference.

    Raises:
        InputError: ``validate.data`` unreadable or not fitting the input spec.
    """
    rng = np.random.default_rng(cfg.validate.seed)
    arrays: Feeds = {}
    user = user_batches(cfg)
    for point in SHAPE_POINTS:
        for s in range(cfg.validate.samples):
            feeds = feeds_at(cfg, point, rng)
            store_goldens(arrays, point, s, feeds, outputs(feeds))
    for s, feeds in enumerate(user):
        store_goldens(arrays, "data", s, feeds, outputs(feeds))
    held = [] if calibration_file(cfg) is not None else heldout_calibration(cfg)  # else already "data"
    for s, feeds in enumerate(held):
        store_goldens(arrays, HELDOUT_POINT, s, feeds, outputs(feeds))
    metrics = {
        "points": list(SHAPE_POINTS),
        "samples": cfg.validate.samples,
        "user_batches": len(user),
        "heldout_calibration_batches": len(held),
    }
    return arrays, metrics


def check_finite(arrays: Feeds, stage: str, reference: str) -> None:
    """Raises:
    StageError: the reference (``reference``: "PyTorch model") produced NaN/Inf in some output.
    """
    nonfinite = [k for k, v in arrays.items() if "/out/" in k and v.dtype.kind == "f" and not np.isfinite(v).all()]
    if nonfinite:
        raise StageError(
            stage,
            f"the {reference} itself produced NaN/Inf in {', '.join(nonfinite[:4])}",
            hint="fix the model or its weights before exporting",
        )


def user_batches(cfg: DeployConfig) -> list[Feeds]:
    """Batches from ``validate.data`` (.npz with one array per input name, or .txt sentences with model.hf),
    else one calibration batch; checked against the spec.

    Raises:
        InputError: the file is unreadable or its arrays do not fit the input spec.
    """
    path = cfg.path(cfg.validate.data)
    if path is None:
        return calibration_samples(cfg)
    if path.suffix.lower() == ".txt":  # sentences for a model.hf folder, tokenized by its tokenizer
        from edgedeploy.modelio.hf import text_batches

        batches = text_batches(cfg, path, limit=64)
        for b in batches:
            check_feeds(cfg, b, str(path))
        return batches
    try:
        with np.load(path, allow_pickle=False) as data:
            feeds = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"validation data unreadable: {path} ({exc})", hint="save it with numpy.savez") from None
    check_feeds(cfg, feeds, str(path))
    return [feeds]


def calibration_file(cfg: DeployConfig) -> Path | None:
    """The calibration data file (.npz / .npy / .txt) when there is one and no validate.data."""
    path = cfg.path(cfg.precision.calib)
    if cfg.validate.data or path is None or not path.is_file():
        return None
    return path if path.suffix.lower() in (".npz", ".npy", ".txt") else None


def calibration_key(cfg: DeployConfig) -> str:
    """sha256 of the calibration file whose batches go into the goldens ("" when none does)."""
    from edgedeploy.fileio.hashing import sha256_file

    path = calibration_file(cfg)
    return sha256_file(path) if path is not None else ""


def calibration_samples(cfg: DeployConfig) -> list[Feeds]:
    """Real samples in the goldens when no validate.data is given: the calibration batches held out of
    calibration (the precision stage's split, never calibrated on), or the one batch when nothing is held out."""
    if calibration_file(cfg) is None:
        return []
    from edgedeploy.precision.data import load_calibration, split_heldout

    batches = list(load_calibration(cfg).batches)
    return split_heldout(batches)[1] or batches[:1]


def heldout_key(cfg: DeployConfig) -> Any:
    """What the held-out calibration batches in the goldens depend on (None when there are none)."""
    p = cfg.precision
    if p.mode == "fp32" or not (p.calib or p.calib_callable):
        return None
    from edgedeploy.precision.data import calibration_fingerprint

    return [p.mode, calibration_fingerprint(cfg), "views-1"]  # views-1: held-out image views


def heldout_calibration(cfg: DeployConfig) -> list[Feeds]:
    """For FP16/INT8 builds calibrated on a folder or callable: the held-out calibration batches (the precision
    stage's split), so every later check, on the host and in the device bundle's own run, sees real inputs.

    Empty for FP32 builds and when no calibration data is configured (the precision stage reports that).
    """
    p = cfg.precision
    if p.mode == "fp32" or not (p.calib or p.calib_callable):
        return []
    from edgedeploy.errors import DeployError
    from edgedeploy.precision.data import load_calibration, split_for_judging

    try:
        calib = load_calibration(cfg)
    except DeployError:  # the precision stage fails on the same data with the full message
        return []
    return split_for_judging(calib.batches, calib.kind, p.calib_layout)[1]
