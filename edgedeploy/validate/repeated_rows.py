"""Batch consistency's inputs: a batch of one sample's row repeated, and which outputs follow the batch.

Domain layer: reads the config's input specs and dims; runs the model only through the ``infer`` it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgedeploy.config import DeployConfig


def repeated_row_batch(
    cfg: DeployConfig, feeds: dict[str, np.ndarray], rows: int | None = None
) -> tuple[dict[str, np.ndarray], int] | None:
    """A batch of ``rows`` (default: the largest size of the leading dynamic dim), every row a copy of row 0 of
    ``feeds``.

    None when the first input has no named leading (batch) dim or its max size is 1.
    """
    first = cfg.inputs[0]
    lead = first.shape[0] if first.shape and isinstance(first.shape[0], str) else None
    if lead is None or cfg.dims[lead].max < 2:
        return None
    n = rows or cfg.dims[lead].max
    batch = {}
    for spec in cfg.inputs:
        arr = feeds[spec.name]
        if spec.shape and spec.shape[0] == lead:
            arr = np.repeat(arr[:1], n, axis=0)
        batch[spec.name] = np.ascontiguousarray(arr)
    return batch, n


def batch_major_outputs(
    infer: Callable[[dict[str, np.ndarray]], dict[str, Any]],
    cfg: DeployConfig,
    feeds: dict[str, np.ndarray],
    outputs: dict[str, np.ndarray],
    rows: int,
) -> set[str] | None:
    """The outputs whose leading axis follows the batch: ``rows`` long in ``outputs`` (a batch of ``rows``) and
    as long as the batch in a run at another batch size. An output whose leading axis only happens to equal
    ``rows`` (4 detections, a fixed 4 x k table) is not the batch's, and its rows are not one sample's. None
    where the dims allow no smaller batch to compare with."""
    first = cfg.inputs[0].shape[0]
    fits = isinstance(first, str) and rows - 1 >= cfg.dims[first].min
    other = repeated_row_batch(cfg, feeds, rows - 1) if fits else None
    if other is None:
        return None  # no other batch size to run: every output as long as the batch counts as the batch's
    smaller, m = other
    lead = {name: np.shape(arr)[:1] for name, arr in infer(smaller).items()}
    return {name for name, arr in outputs.items() if arr.shape[:1] == (rows,) and lead.get(name) == (m,)}
