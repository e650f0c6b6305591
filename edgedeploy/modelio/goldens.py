"""goldens.npz I/O: seeded inputs and the eager model's outputs, keyed ``point/sample/kind/name``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.artifacts import GOLDENS  # noqa: F401  (re-exported for callers that name the file)
from edgedeploy.errors import InputError, StageError
from edgedeploy.modelio.torchutil import flatten, torch_args


def golden_key(point: str, sample: int, kind: str, name: str) -> str:
    return f"{point}/{sample}/{kind}/{name}"


def load_goldens(path: str | Path) -> dict[str, dict[int, dict[str, Any]]]:
    """goldens.npz → {point: {sample: {"in": {...}, "out": {...}, "sparse": {name: (shape, stride)}}}}: inputs
    stored as seeds regenerated, sparingly stored outputs as their stored elements
    (:func:`edgedeploy.validate.parity.goldens_from_arrays`).

    Raises:
        InputError: the file is missing or not a goldens archive.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"goldens file unreadable: {path} ({exc})") from None
    from edgedeploy.device.goldens_format import goldens_from_arrays

    try:
        return goldens_from_arrays(arrays)
    except ValueError as exc:
        raise InputError(f"{path}: {exc}") from None


def torch_outputs(model: Any, cfg: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the eager model on numpy feeds; map its outputs onto the configured output names.

    Raises:
        StageError: the model's output count differs from the configured ``outputs``.
    """
    import torch

    with torch.inference_mode():
        result = model(*torch_args(cfg, feeds))
    flat = flatten(result)
    if len(flat) != len(cfg.outputs):
        raise StageError(
            "reference",
            f"model returned {len(flat)} outputs, config names {len(cfg.outputs)} ({', '.join(cfg.outputs)})",
            hint="make 'outputs' list one name per model output (--output NAME per output)",
        )
    return {name: t.detach().cpu().numpy() for name, t in zip(cfg.outputs, flat)}


def store_goldens(
    arrays: dict[str, np.ndarray],
    point: str,
    s: int,
    feeds: dict[str, np.ndarray],
    outs: dict[str, np.ndarray],
    gens: dict[str, np.ndarray] | None = None,
) -> None:
    """Put one golden sample into ``arrays``; inputs named in ``gens`` are stored as their seed entry, float32
    inputs whose every value is a float16 value as float16 (``half``: read back equal, in half the bytes)."""
    from edgedeploy.device.goldens_format import half_exact

    for n, a in feeds.items():
        if gens and n in gens:
            arrays[golden_key(point, s, "gen", n)] = gens[n]
        elif half_exact(a):
            arrays[golden_key(point, s, "half", n)] = a.astype(np.float16)
        else:
            arrays[golden_key(point, s, "in", n)] = a
    for n, a in outs.items():
        arrays[golden_key(point, s, "out", n)] = a


def not_deterministic(
    model: Any, cfg: Any, feeds: dict[str, np.ndarray], first: dict[str, np.ndarray], atol: float
) -> str | None:
    """Why eager PyTorch cannot be the reference, or None: a second run on ``feeds`` gives outputs other than
    ``first`` (the first run's) by more than ``atol``. Randomness in ``forward`` (``F.dropout(training=True)``,
    ``torch.rand``) or a buffer it updates make every capture and export differ from any eager run.

    Raises:
        StageError: the model's output count differs from the configured ``outputs``.
    """
    again = torch_outputs(model, cfg, feeds)
    for name, ref in first.items():
        got = again.get(name)
        if got is None or got.shape != ref.shape:
            shape = None if got is None else list(got.shape)
            return f"output {name!r} has shape {shape} on a second run, {list(ref.shape)} on the first"
        if got.size and np.issubdtype(got.dtype, np.number):
            diff = float(np.nanmax(np.abs(got.astype(np.float64) - ref.astype(np.float64)), initial=0.0))
            if diff > atol or not np.array_equal(np.isnan(got), np.isnan(ref)):
                return f"output {name!r} differs by {diff:.3g} between two runs on the same input"
    return None


NOT_DETERMINISTIC_FIX = (
    "make forward() give the same output for the same input in eval mode: no F.dropout(..., training=True), "
    "torch.rand / randn, or buffer updates (self.count += 1) in forward"
)
