"""Random-number-generator state as JSON data, so a run resumed mid-epoch draws what an uninterrupted one
would (dropout masks, main-process augmentation, Python and NumPy draws)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng(device: torch.device) -> dict[str, Any]:
    """This process's torch (CPU and, on CUDA, the device's), Python and NumPy generator states."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()  # type: ignore[misc]
    state: dict[str, Any] = {
        "torch": torch.get_rng_state().tolist(),
        "python": [version, list(mt), gauss],
        "numpy": [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device).tolist()
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    """Put back a :func:`capture_rng` state."""
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(torch.tensor(state["cuda"], dtype=torch.uint8), device)
