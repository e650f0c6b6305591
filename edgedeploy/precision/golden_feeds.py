"""The inputs goldens.npz holds and their reference outputs, whatever computes them (PyTorch, or ONNX Runtime
FP32 for a model given as ONNX): seeded inputs at min / opt / max, ``validate.data`` (else one calibration
batch), and for FP16 / INT8 builds calibrated on a folder or callable the held-out calibration batches, within
the goldens budget (``validate.goldens_budget_mb``).

Every later comparison (ONNX Runtime here, TensorRT on the device) reads goldens.npz, so validation needs
neither torch nor the source model once the goldens exist.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.config import DeployConfig
from edgedeploy.errors import StageError
from edgedeploy.modelio.goldens import store_goldens
from edgedeploy.modelio.inputs import SHAPE_POINTS, check_feeds, feeds_at
from edgedeploy.precision.analysis import JoinedCalls, batch_groups
from edgedeploy.precision.data import HELDOUT_POINT

Feeds = dict[str, np.ndarray]


# a spec-random float input larger than this is stored as its seed (inputs this small cost nothing to keep)
SEEDED_MIN_BYTES = 64 * 1024
DEFAULT_BUDGET_BYTES = 8_000_000  # goldens budget floor when validate.goldens_budget_mb is unset
BUDGET_MODEL_MULTIPLE = 2  # ... or this many times the model's weights, when larger


def golden_arrays(
    cfg: DeployConfig, outputs: Callable[[Feeds, int, int, str], Feeds], budget: int
) -> tuple[Feeds, dict[str, Any], list[str]]:
    """(goldens.npz arrays, metrics, warnings) fitted to ``budget`` bytes, with ``outputs(feeds, k, n, point)`` as
    the reference (batch ``k`` of ``n``, at shape point ``point``: what a progress line says).

    goldens.npz travels in device bundles, so spec-random float inputs of more than ``SEEDED_MIN_BYTES`` are
    stored as their seed and regenerated where they are read (numpy's legacy RandomState stream,
    ``edgedeploy/device/goldens_format.py``), and the largest outputs, spec-random first, are stored sparingly
    (every n-th element, the full shape still checked) until the file fits. Real samples are kept whole.

    Raises:
        InputError: ``validate.data`` unreadable or not fitting the input spec.
    """
    from edgedeploy.device.goldens_format import fit_budget

    rng = np.random.default_rng(cfg.validate.seed)
    arrays: Feeds = {}
    held = heldout_calibration(cfg)
    # held-out calibration batches are their own point (calib-heldout), whatever the calibration source: under
    # "data" they would read as validate.data and be judged twice. "data" is validate.data, else (an FP32 build,
    # or nothing held out) a calibration batch.
    user = user_batches(cfg) if cfg.validate.data or not held else []
    held_groups = batch_groups(held, max_batch_rows(cfg))
    # the calls to make: one per spec sample and user batch, one per held-out group, and one batch alone to check
    # that joining changes nothing (more where it does: every held-out batch alone then)
    total = len(SHAPE_POINTS) * cfg.validate.samples + len(user) + len(held_groups)
    total += any(len(group) > 1 for group in held_groups)
    done = 0

    def reference(feeds: Feeds, point: str) -> Feeds:
        nonlocal done, total
        done += 1
        total = max(total, done)
        return outputs(feeds, done, total, point)

    seeded = 0
    for p_index, point in enumerate(SHAPE_POINTS):
        for s in range(cfg.validate.samples):
            feeds = feeds_at(cfg, point, rng)
            gens = _seed_large_floats(cfg, feeds, seed=[cfg.validate.seed, p_index, s])
            store_goldens(arrays, point, s, feeds, reference(feeds, point), gens=gens)
            seeded += len(gens)
    for s, feeds in enumerate(user):
        store_goldens(arrays, "data", s, feeds, reference(feeds, "data"))
    joined = JoinedCalls(lambda feeds: reference(feeds, HELDOUT_POINT))
    held_outputs = [out for group in held_groups for out in joined(group)]
    for s, (feeds, outs) in enumerate(zip(held, held_outputs)):
        store_goldens(arrays, HELDOUT_POINT, s, feeds, outs)
    fitted = fit_budget(arrays, budget, protect=["data", HELDOUT_POINT])
    metrics = {
        "points": list(SHAPE_POINTS),
        "samples": cfg.validate.samples,
        "user_batches": len(user),
        "heldout_calibration_batches": len(held),
        "goldens_size": {
            "budget_bytes": budget,
            "bytes": fitted["bytes"],
            "inputs_stored_as_seeds": seeded,
            "outputs_stored_sparingly": {k: f"every {n}th element" for k, n in fitted["sparse"].items()},
            "within_budget": fitted["within_budget"],
        },
    }
    warnings = []
    if not fitted["within_budget"]:
        fixes = ["raise validate.goldens_budget_mb"]  # the fixes that shrink what this file holds
        if cfg.validate.data:
            fixes.append("give fewer validate.data samples")
        if held:
            fixes.append("lower precision.calib_samples (its held-out quarter is stored whole)")
        warnings.append(
            f"goldens.npz is {fitted['bytes'] / 1e6:.1f} MB, over its {budget / 1e6:.1f} MB budget (real samples "
            f"are kept whole): {' or '.join(fixes)}"
        )
    return arrays, metrics, warnings


def max_batch_rows(cfg: DeployConfig) -> int:
    """The most samples one reference call may take: the smallest declared max batch over the inputs (1
    when an input has no batch dim to grow)."""
    most = [cfg.shape_for(spec, "max") for spec in cfg.inputs]
    return max(1, min((int(shape[0]) for shape in most if shape), default=1))


def reference_calls(cfg: DeployConfig, points: Sequence[str], feeds: Sequence[Feeds]) -> list[list[int]]:
    """Indices into ``feeds`` (the goldens' inputs, at ``points``, in goldens order) grouped into the calls the
    reference made: consecutive held-out calibration batches joined as :func:`golden_arrays` joined them (up to
    :func:`max_batch_rows` samples a call), every other input alone. A candidate run on the same calls sees
    exactly the reference's inputs; where joining changes an output (rows that see each other), both the reference
    and the candidate run each batch alone instead
    (:class:`edgedeploy.precision.analysis.JoinedCalls`)."""
    calls: list[list[int]] = []
    held = [i for i, point in enumerate(points) if point == HELDOUT_POINT]
    position = 0
    for group in batch_groups([feeds[i] for i in held], max_batch_rows(cfg)):
        calls.append(held[position : position + len(group)])
        position += len(group)
    calls += [[i] for i, point in enumerate(points) if point != HELDOUT_POINT]
    return sorted(calls)


def budget_bytes(cfg: DeployConfig, model_bytes: int) -> int:
    """validate.goldens_budget_mb in bytes, else the larger of 8 MB and twice the model's weights."""
    if cfg.validate.goldens_budget_mb is not None:
        return int(cfg.validate.goldens_budget_mb * 1e6)
    return max(DEFAULT_BUDGET_BYTES, BUDGET_MODEL_MULTIPLE * model_bytes)


def _seed_large_floats(cfg: DeployConfig, feeds: Feeds, seed: list[int]) -> Feeds:
    """Replace each large spec-random float input in ``feeds`` (in place) by one drawn from a seed; return the
    ``gen`` entries that stand for them in goldens.npz."""
    from edgedeploy.device.goldens_format import gen_entry, seeded_uniform
    from edgedeploy.modelio.generators import kind_of

    gens: Feeds = {}
    for i, spec in enumerate(cfg.inputs):
        arr = feeds[spec.name]
        if kind_of(spec) != "float" or arr.nbytes <= SEEDED_MIN_BYTES:
            continue
        value = int(np.random.SeedSequence([*seed, i]).generate_state(1)[0])
        lo, hi = float(spec.range[0]), float(spec.range[1])
        feeds[spec.name] = seeded_uniform(value, list(arr.shape), lo, hi, spec.dtype)
        gens[spec.name] = gen_entry(value, list(arr.shape), lo, hi, spec.dtype)
    return gens


def goldens_config_key(cfg: DeployConfig) -> dict[str, Any]:
    """Every config field goldens.npz depends on (the reference stages' cache key), whatever computes them."""
    d = cfg.to_dict()
    return {
        "model": d["model"],
        "inputs": d["inputs"],
        "dims": d["dims"],
        "outputs": list(cfg.outputs),
        "validate": [cfg.validate.samples, cfg.validate.seed, cfg.validate.data, cfg.validate.goldens_budget_mb],
        "calibration": calibration_key(cfg),
        "heldout_calibration": heldout_key(cfg),
    }


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
    else calibration batches (:func:`calibration_samples`); checked against the spec.

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
    from edgedeploy.fileio.arrays import read_npz
    from edgedeploy.precision.data import sample_bytes_bound

    # one batch of at most the max batch size: a row more is enough for check_feeds to refuse a bigger file
    most = max(cfg.shape_for(s, "max")[0] if cfg.shape_for(s, "max") else 1 for s in cfg.inputs)
    read, _ = read_npz(path, None, limit=most + 1, row_bound=sample_bytes_bound(cfg))
    names = [s.name for s in cfg.inputs]
    if len(read) == 1 and len(names) == 1 and names[0] not in read:  # one array for one input, as calibration reads
        read = {names[0]: next(iter(read.values()))}
    # more rows than a batch takes: check_feeds sees the declared count (a view, nothing more is read) and refuses
    feeds = {
        k: arr if rows <= most else np.broadcast_to(arr[:1], (rows, *arr.shape[1:])) for k, (arr, rows) in read.items()
    }
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

    # how the data is loaded decides which samples are held out, and how they look (views-1: held-out image views)
    loading = {"samples": p.calib_samples, "resize": list(p.calib_resize), "layout": p.calib_layout}
    return [p.mode, calibration_fingerprint(cfg), loading, cfg.model.normalization, "views-1"]


def heldout_calibration(cfg: DeployConfig) -> list[Feeds]:
    """For FP16/INT8 builds with calibration data: the held-out calibration batches (the precision stage's
    split), so every later check, on the host and in the device bundle's own run, sees real inputs.

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
    return split_for_judging(calib.batches, calib.kind, p.calib_layout, half_grid=p.mode == "int8")[1]
