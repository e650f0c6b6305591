"""Learning-rate schedules as closed forms of the optimizer step (``LambdaLR``), plus ``OneCycleLR``.

Every schedule's state is JSON data saved with a checkpoint and loaded on resume (never replayed), and
each learning rate is computed from the step count alone, never from the optimizer's current rate, so a
resumed run sets exactly the rates an uninterrupted one does.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class ScheduleFactor:
    """The multiplier of each group's base learning rate at optimizer step ``s``.

    Linear warm-up over ``warmup`` steps (``(s + 1) / warmup``), then ``constant`` (1) or ``cosine``
    (``0.5 * (1 + cos(pi * p))`` with ``p`` the fraction of the post-warm-up steps done, reaching 0 after
    ``total`` steps). Its attributes are plain numbers: ``LambdaLR.state_dict`` saves them as JSON data.
    """

    def __init__(self, kind: str, total: int, warmup: int = 0) -> None:
        self.kind = kind
        self.total = total
        self.warmup = warmup

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.kind == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: str, total_steps: int, warmup_steps: int = 0) -> Any:
    """The scheduler for ``optim.schedule`` over ``total_steps`` optimizer steps (None: constant, no warm-up)."""
    total = max(1, total_steps)
    if schedule == "onecycle":  # warms up by itself (pct_start) and also cycles momentum
        max_lr = [g["lr"] for g in optimizer.param_groups]
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=max_lr, total_steps=total)
    if schedule == "constant" and not warmup_steps:
        return None
    return torch.optim.lr_scheduler.LambdaLR(optimizer, ScheduleFactor(schedule, total, warmup_steps))
