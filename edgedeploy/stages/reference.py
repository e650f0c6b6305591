"""GoldensFromTorch: seeded inputs at min/opt/max and the PyTorch model's outputs, saved as goldens.npz.

Every later comparison (ONNX Runtime here, TensorRT on the device) reads these
files, so validation needs no torch once the goldens exist.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.errors import InputError, StageError
from edgedeploy.pipeline.context import BuildContext
from edgedeploy.stages.base import Stage
from edgedeploy.stages.inputs import SHAPE_POINTS, check_feeds, feeds_at

GOLDENS = "goldens.npz"
HELDOUT_POINT = "calib-heldout"  # real samples held out of INT8/FP16 calibration (never calibrated on)


def golden_key(point: str, sample: int, kind: str, name: str) -> str:
    return f"{point}/{sample}/{kind}/{name}"


def load_goldens(path: str | Path) -> dict[str, dict[int, dict[str, dict[str, np.ndarray]]]]:
    """goldens.npz → {point: {sample: {"in": {...}, "out": {...}}}}.

    Raises:
        InputError: the file is missing or not a goldens archive.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"goldens file unreadable: {path} ({exc})") from None
    out: dict[str, dict[int, dict[str, dict[str, np.ndarray]]]] = {}
    for key, arr in arrays.items():
        try:
            point, sample, kind, name = key.split("/", 3)
        except ValueError:
            raise InputError(f"{path}: unexpected entry {key!r} (not an edgedeploy goldens file)") from None
        out.setdefault(point, {}).setdefault(int(sample), {"in": {}, "out": {}})[kind][name] = arr
    return out


def torch_outputs(model: Any, cfg: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the eager model on numpy feeds; map its outputs onto the configured output names.

    Raises:
        StageError: the model's output count differs from the configured ``outputs``.
    """
    import torch

    args = [torch.from_numpy(np.ascontiguousarray(feeds[s.name])) for s in cfg.inputs]
    with torch.inference_mode():
        result = model(*args)
    flat = _flatten(result)
    if len(flat) != len(cfg.outputs):
        raise StageError(
            "reference",
            f"model returned {len(flat)} outputs, config names {len(cfg.outputs)} ({', '.join(cfg.outputs)})",
            hint="make 'outputs' list one name per model output",
        )
    return {name: t.detach().cpu().numpy() for name, t in zip(cfg.outputs, flat)}


def _flatten(result: Any) -> list[Any]:
    if isinstance(result, (list, tuple)):
        return [t for r in result for t in _flatten(r)]
    if isinstance(result, dict):
        return [t for v in result.values() for t in _flatten(v)]
    return [result]


class GoldensFromTorch(Stage):
    name = "reference"
    version = "1"
    consumes = ("checkpoint", "model_code")
    produces = (GOLDENS,)

    def config_key(self, ctx: BuildContext) -> Any:
        c = ctx.cfg
        return {
            "model": c.to_dict()["model"],
            "inputs": c.to_dict()["inputs"],
            "dims": c.to_dict()["dims"],
            "outputs": list(c.outputs),
            "validate": [c.validate.samples, c.validate.seed, c.validate.data],
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
                _store(arrays, point, s, feeds, torch_outputs(model, cfg, feeds))
        for s, feeds in enumerate(user):
            _store(arrays, "data", s, feeds, torch_outputs(model, cfg, feeds))
        held = _heldout_calibration(ctx)
        for s, feeds in enumerate(held):
            _store(arrays, HELDOUT_POINT, s, feeds, torch_outputs(model, cfg, feeds))
        np.savez(ctx.staging / GOLDENS, **arrays)
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


def _store(
    arrays: dict[str, np.ndarray], point: str, s: int, feeds: dict[str, np.ndarray], outs: dict[str, np.ndarray]
) -> None:
    for n, a in feeds.items():
        arrays[golden_key(point, s, "in", n)] = a
    for n, a in outs.items():
        arrays[golden_key(point, s, "out", n)] = a


def _user_data(ctx: BuildContext) -> list[dict[str, np.ndarray]]:
    """Batches from ``validate.data`` (.npz with one array per input name), checked against the spec."""
    path = ctx.cfg.path(ctx.cfg.validate.data)
    if path is None:
        return []
    if not path.is_file():
        raise InputError(f"validation data not found: {path}", hint="fix validate.data")
    try:
        with np.load(path, allow_pickle=False) as data:
            feeds = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"validation data unreadable: {path} ({exc})", hint="save it with numpy.savez") from None
    check_feeds(ctx.cfg, feeds, str(path))
    return [feeds]


def _heldout_key(ctx: BuildContext) -> Any:
    if ctx.precision == "fp32":
        return None
    from edgedeploy.precision.data import calibration_fingerprint

    return [ctx.precision, calibration_fingerprint(ctx.cfg)]


def _heldout_calibration(ctx: BuildContext) -> list[dict[str, np.ndarray]]:
    """For FP16/INT8 builds with real calibration data: the held-out calibration batches (the precision stage's
    split), so every later check, on the host and in the device bundle's own run, also sees real inputs.

    Empty for FP32 builds and when no calibration data is configured (the precision stage reports that).
    """
    p = ctx.cfg.precision
    if ctx.precision == "fp32" or not (p.calib or p.calib_callable):
        return []
    from edgedeploy.errors import DeployError
    from edgedeploy.precision.data import load_calibration, split_heldout

    try:
        calib = load_calibration(ctx.cfg)
    except DeployError:  # the precision stage fails on the same data with the full message
        return []
    return split_heldout(list(calib.batches))[1]
