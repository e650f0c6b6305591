"""GoldensFromTorch: seeded inputs at min/opt/max and the PyTorch model's outputs, saved as goldens.npz.

Every later comparison (ONNX Runtime here, TensorRT on the device) reads these
files, so validation needs no torch once the goldens exist.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgedeploy import stagenames as names
from edgedeploy.artifacts import CALIB_CODE, GOLDENS, VALIDATION_DATA
from edgedeploy.errors import StageError
from edgedeploy.modelio.goldens import store_goldens, torch_outputs
from edgedeploy.modelio.inputs import SHAPE_POINTS, check_feeds, feeds_at
from edgedeploy.precision.data import HELDOUT_POINT
from edgedeploy.stages.base import BuildContext, Stage, model_inputs

if TYPE_CHECKING:
    from edgedeploy.config import DeployConfig


class GoldensFromTorch(Stage):
    name = names.REFERENCE
    version = "1"
    produces = (GOLDENS,)

    def inputs(self, ctx: BuildContext) -> tuple[str, ...]:
        # the held-out calibration batches go into the goldens: a calibration callable's code is an input too
        extra = (VALIDATION_DATA, CALIB_CODE)
        return model_inputs(ctx) + tuple(name for name in extra if ctx.has_input(name))

    def config_key(self, ctx: BuildContext) -> Any:
        c = ctx.cfg
        return {
            "model": c.to_dict()["model"],
            "inputs": c.to_dict()["inputs"],
            "dims": c.to_dict()["dims"],
            "outputs": list(c.outputs),
            "validate": [c.validate.samples, c.validate.seed, c.validate.data],
            "calibration": _calibration_key(c),
            "heldout_calibration": _heldout_key(ctx),
        }

    def run(self, ctx: BuildContext) -> dict[str, Any]:
        cfg = ctx.cfg
        model = ctx.model()
        rng = np.random.default_rng(cfg.validate.seed)
        arrays: dict[str, np.ndarray] = {}
        user = _user_data(ctx)
        for point in SHAPE_POINTS:
            for s in range(cfg.validate.samples):
                feeds = feeds_at(cfg, point, rng)
                store_goldens(arrays, point, s, feeds, torch_outputs(model, cfg, feeds))
        for s, feeds in enumerate(user):
            store_goldens(arrays, "data", s, feeds, torch_outputs(model, cfg, feeds))
        held = [] if _calibration_file(cfg) is not None else _heldout_calibration(ctx)  # else already "data"
        for s, feeds in enumerate(held):
            store_goldens(arrays, HELDOUT_POINT, s, feeds, torch_outputs(model, cfg, feeds))
        # numpy's stubs type **kwds against its own allow_pickle flag; these are all arrays
        np.savez(ctx.staging / GOLDENS, **arrays)  # type: ignore[arg-type]
        nonfinite = [k for k, v in arrays.items() if "/out/" in k and v.dtype.kind == "f" and not np.isfinite(v).all()]
        if nonfinite:
            raise StageError(
                "reference",
                f"the PyTorch model itself produced NaN/Inf in {', '.join(nonfinite[:4])}",
                hint="fix the model or its weights before exporting",
            )
        return {
            "points": list(SHAPE_POINTS),
            "samples": cfg.validate.samples,
            "user_batches": len(user),
            "heldout_calibration_batches": len(held),
        }


def _user_data(ctx: BuildContext) -> list[dict[str, np.ndarray]]:
    """Batches from ``validate.data`` (.npz with one array per input name, or .txt sentences with model.hf),
    else one calibration batch; checked against the spec."""
    if VALIDATION_DATA not in ctx.external:
        return _calibration_samples(ctx.cfg)
    path = ctx.path(VALIDATION_DATA)
    if path.suffix.lower() == ".txt":  # sentences for a model.hf folder, tokenized by its tokenizer
        from edgedeploy.modelio.hf import text_batches

        batches = text_batches(ctx.cfg, path, limit=64)
        for b in batches:
            check_feeds(ctx.cfg, b, str(path))
        return batches
    from edgedeploy.fileio.arrays import read_npz
    from edgedeploy.precision.data import sample_bytes_bound

    # one batch of at most the max batch size: a row more is enough for check_feeds to refuse a bigger file
    most = max(ctx.cfg.shape_for(s, "max")[0] if ctx.cfg.shape_for(s, "max") else 1 for s in ctx.cfg.inputs)
    read, _ = read_npz(path, None, limit=most + 1, row_bound=sample_bytes_bound(ctx.cfg))
    # more rows than a batch takes: check_feeds sees the declared count (a view, nothing more is read) and refuses
    feeds = {
        k: arr if rows <= most else np.broadcast_to(arr[:1], (rows, *arr.shape[1:])) for k, (arr, rows) in read.items()
    }
    check_feeds(ctx.cfg, feeds, str(path))
    return [feeds]


def _calibration_file(cfg: DeployConfig) -> Path | None:
    """The calibration data file (.npz / .npy / .txt) when there is one and no validate.data."""
    path = cfg.path(cfg.precision.calib)
    if cfg.validate.data or path is None or not path.is_file():
        return None
    return path if path.suffix.lower() in (".npz", ".npy", ".txt") else None


def _calibration_key(cfg: DeployConfig) -> str:
    from edgedeploy.fileio.hashing import sha256_file

    path = _calibration_file(cfg)
    return sha256_file(path) if path is not None else ""


def _calibration_samples(cfg: DeployConfig) -> list[dict[str, np.ndarray]]:
    """Real samples in the goldens when no validate.data is given: the calibration batches held out of
    calibration (the precision stage's split, never calibrated on), or the one batch when nothing is held out."""
    if _calibration_file(cfg) is None:
        return []
    from edgedeploy.precision.data import load_calibration, split_heldout

    batches = list(load_calibration(cfg).batches)
    return split_heldout(batches)[1] or batches[:1]


def _heldout_key(ctx: BuildContext) -> Any:
    p = ctx.cfg.precision
    if ctx.precision == "fp32" or not (p.calib or p.calib_callable):
        return None
    from edgedeploy.precision.data import calibration_fingerprint

    return [ctx.precision, calibration_fingerprint(ctx.cfg), "views-1"]  # views-1: held-out image views


def _heldout_calibration(ctx: BuildContext) -> list[dict[str, np.ndarray]]:
    """For FP16/INT8 builds calibrated on a folder or callable: the held-out calibration batches (the precision
    stage's split), so every later check, on the host and in the device bundle's own run, sees real inputs.

    Empty for FP32 builds and when no calibration data is configured (the precision stage reports that).
    """
    p = ctx.cfg.precision
    if ctx.precision == "fp32" or not (p.calib or p.calib_callable):
        return []
    from edgedeploy.errors import DeployError
    from edgedeploy.precision.data import load_calibration, split_for_judging

    try:
        calib = load_calibration(ctx.cfg)
    except DeployError:  # the precision stage fails on the same data with the full message
        return []
    return split_for_judging(calib.batches, calib.kind, p.calib_layout)[1]
