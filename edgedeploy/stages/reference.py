"""GoldensFromTorch: seeded inputs at min/opt/max and the PyTorch model's outputs, saved as goldens.npz.

Every later comparison (ONNX Runtime here, TensorRT on the device) reads these
files, so validation needs no torch once the goldens exist.

goldens.npz travels in device bundles, so it is kept within ``validate.goldens_budget_mb`` (default: the
larger of 8 MB and twice the model's weights): spec-random float inputs of more than ``SEEDED_MIN_BYTES`` are
stored as their seed and regenerated where they are read (numpy's legacy RandomState stream,
``edgedeploy/device/goldens_format.py``), and the largest outputs, spec-random first, are stored sparingly
(every n-th element, the full shape still checked) until the file fits. The stage metrics say what was kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgedeploy import stagenames as names
from edgedeploy.artifacts import CALIB_CODE, GOLDENS, VALIDATION_DATA
from edgedeploy.errors import InputError, StageError
from edgedeploy.modelio.goldens import store_goldens, torch_outputs
from edgedeploy.modelio.inputs import SHAPE_POINTS, check_feeds, feeds_at
from edgedeploy.precision.data import HELDOUT_POINT
from edgedeploy.stages.base import BuildContext, Stage, StageResult, model_inputs

if TYPE_CHECKING:
    from edgedeploy.config import DeployConfig


# a spec-random float input larger than this is stored as its seed (inputs this small cost nothing to keep)
SEEDED_MIN_BYTES = 64 * 1024
DEFAULT_BUDGET_BYTES = 8_000_000  # goldens budget floor when validate.goldens_budget_mb is unset
BUDGET_MODEL_MULTIPLE = 2  # ... or this many times the model's weights, when larger


class GoldensFromTorch(Stage):
    name = names.REFERENCE
    version = "2"
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
            "validate": [c.validate.samples, c.validate.seed, c.validate.data, c.validate.goldens_budget_mb],
            "calibration": _calibration_key(c),
            "heldout_calibration": _heldout_key(ctx),
        }

    def run(self, ctx: BuildContext) -> StageResult:
        cfg = ctx.cfg
        model = ctx.model()
        rng = np.random.default_rng(cfg.validate.seed)
        arrays: dict[str, np.ndarray] = {}
        user = _user_data(ctx)
        seeded = 0
        for p_index, point in enumerate(SHAPE_POINTS):
            for s in range(cfg.validate.samples):
                feeds = feeds_at(cfg, point, rng)
                gens = _seed_large_floats(cfg, feeds, seed=[cfg.validate.seed, p_index, s])
                store_goldens(arrays, point, s, feeds, torch_outputs(model, cfg, feeds), gens=gens)
                seeded += len(gens)
        for s, feeds in enumerate(user):
            store_goldens(arrays, "data", s, feeds, torch_outputs(model, cfg, feeds))
        held = [] if _calibration_file(cfg) is not None else _heldout_calibration(ctx)  # else already "data"
        for s, feeds in enumerate(held):
            store_goldens(arrays, HELDOUT_POINT, s, feeds, torch_outputs(model, cfg, feeds))
        from edgedeploy.device.goldens_format import fit_budget

        budget = _budget_bytes(cfg, model)
        fitted = fit_budget(arrays, budget, protect=["data", HELDOUT_POINT])
        # numpy's stubs type **kwds against its own allow_pickle flag; these are all arrays
        np.savez(ctx.staging / GOLDENS, **arrays)  # type: ignore[arg-type]
        nonfinite = [k for k, v in arrays.items() if "/out/" in k and v.dtype.kind == "f" and not np.isfinite(v).all()]
        if nonfinite:
            raise StageError(
                "reference",
                f"the PyTorch model itself produced NaN/Inf in {', '.join(nonfinite[:4])}",
                hint="fix the model or its weights before exporting",
            )
        size = {
            "budget_bytes": budget,
            "bytes": fitted["bytes"],
            "inputs_stored_as_seeds": seeded,
            "outputs_stored_sparingly": {k: f"every {n}th element" for k, n in fitted["sparse"].items()},
            "within_budget": fitted["within_budget"],
        }
        result = StageResult(
            {
                "points": list(SHAPE_POINTS),
                "samples": cfg.validate.samples,
                "user_batches": len(user),
                "heldout_calibration_batches": len(held),
                "goldens_size": size,
            }
        )
        if not fitted["within_budget"]:
            result.warnings.append(
                f"goldens.npz is {fitted['bytes'] / 1e6:.1f} MB, over its {budget / 1e6:.1f} MB budget (real samples "
                "are kept whole): raise validate.goldens_budget_mb or give fewer validate.data samples"
            )
        return result


def _seed_large_floats(cfg: DeployConfig, feeds: dict[str, np.ndarray], seed: list[int]) -> dict[str, np.ndarray]:
    """Replace each large spec-random float input in ``feeds`` (in place) by one drawn from a seed; return the
    ``gen`` entries that stand for them in goldens.npz."""
    from edgedeploy.device.goldens_format import gen_entry, seeded_uniform
    from edgedeploy.modelio.generators import kind_of

    gens: dict[str, np.ndarray] = {}
    for i, spec in enumerate(cfg.inputs):
        arr = feeds[spec.name]
        if kind_of(spec) != "float" or arr.nbytes <= SEEDED_MIN_BYTES:
            continue
        value = int(np.random.SeedSequence([*seed, i]).generate_state(1)[0])
        lo, hi = float(spec.range[0]), float(spec.range[1])
        feeds[spec.name] = seeded_uniform(value, list(arr.shape), lo, hi, spec.dtype)
        gens[spec.name] = gen_entry(value, list(arr.shape), lo, hi, spec.dtype)
    return gens


def _budget_bytes(cfg: DeployConfig, model: Any) -> int:
    """validate.goldens_budget_mb in bytes, else the larger of 8 MB and twice the model's weights."""
    if cfg.validate.goldens_budget_mb is not None:
        return int(cfg.validate.goldens_budget_mb * 1e6)
    weights = sum(int(t.numel()) * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return max(DEFAULT_BUDGET_BYTES, BUDGET_MODEL_MULTIPLE * weights)


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
    try:
        with np.load(path, allow_pickle=False) as data:
            feeds = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"validation data unreadable: {path} ({exc})", hint="save it with numpy.savez") from None
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
