"""Model selection on a validation metric: best / top-k checkpoints and early stopping.

Both are functions of the run's per-epoch history (saved with every checkpoint), so a resumed run
selects and stops exactly as an uninterrupted one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def better(mode: str, value: float, than: float, min_delta: float = 0.0) -> bool:
    """Whether ``value`` improves on ``than`` by more than ``min_delta`` (``mode`` min or max)."""
    if not math.isfinite(value):
        return False
    if not math.isfinite(than):
        return True
    return value < than - min_delta if mode == "min" else value > than + min_delta


def resolve_mode(metric: str, mode: str) -> str:
    """``auto``: ``min`` for a loss, ``max`` otherwise (accuracy)."""
    return ("min" if "loss" in metric else "max") if mode == "auto" else mode


def ranked_epochs(history: Sequence[dict[str, Any]], metric: str, mode: str) -> list[int]:
    """Epoch numbers ordered best first by ``metric`` (ties: the earlier epoch first)."""
    scored = [(float(h[metric]), int(h["epoch"])) for h in history if metric in h and math.isfinite(float(h[metric]))]
    sign = 1.0 if mode == "min" else -1.0
    return [epoch for value, epoch in sorted(scored, key=lambda t: (sign * t[0], t[1]))]


def epochs_without_improvement(history: Sequence[dict[str, Any]], metric: str, mode: str, min_delta: float) -> int:
    """Epochs since the metric last improved by more than ``min_delta`` on its best so far."""
    best, since = math.nan, 0
    for h in history:
        value = float(h.get(metric, math.nan))
        if better(mode, value, best, min_delta):
            best, since = value, 0
        else:
            since += 1
    return since


def top_k_path(checkpoint: Path, epoch: int) -> Path:
    """``OUT/<name>.epoch<E>.safetensors``: a kept top-k checkpoint."""
    return checkpoint.with_name(f"{checkpoint.stem}.epoch{epoch}.safetensors")


def best_path(checkpoint: Path) -> Path:
    """``OUT/<name>.best.safetensors``: the best epoch's weights and sidecar."""
    return checkpoint.with_name(f"{checkpoint.stem}.best.safetensors")
