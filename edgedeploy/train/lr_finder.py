"""Learning-rate range test: raise the lr exponentially over a few batches and watch the loss."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgedeploy.errors import ConfigError


@dataclass(frozen=True)
class LRRangeResult:
    """The lrs tried, the smoothed losses seen at each, and a suggested lr."""

    lrs: list[float]
    losses: list[float]
    suggested_lr: float

    def plot(self, path: str | Path) -> Path:
        """Write loss-vs-lr (log x axis) as a PNG; matplotlib is imported here with the Agg backend."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(6, 4))
        try:
            ax.plot(self.lrs, self.losses)
            ax.set_xscale("log")
            ax.axvline(self.suggested_lr, color="tab:red", linestyle="--", label=f"suggested {self.suggested_lr:.2e}")
            ax.set_xlabel("learning rate")
            ax.set_ylabel("loss (smoothed)")
            ax.legend()
            fig.tight_layout()
            fig.savefig(path, format="png", dpi=80)
        finally:
            plt.close(fig)
        return path


def lr_range_test(
    model: nn.Module,
    batches: Iterable[Any],
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    *,
    start_lr: float = 1e-6,
    end_lr: float = 1.0,
    num_iter: int = 100,
    smoothing: float = 0.9,
    diverge_factor: float = 4.0,
) -> LRRangeResult:
    """Train ``num_iter`` batches with the lr rising exponentially from ``start_lr`` to ``end_lr``.

    Stops early when the smoothed loss exceeds ``diverge_factor`` times its best. Model and optimizer
    are restored afterwards, so the test leaves no trace. The suggestion is the lr at the steepest
    descent of the smoothed loss (against log lr), a common, conservative pick.

    ``batches`` yields ``(inputs, targets)`` and is streamed: at most ``num_iter`` batches are
    drawn, so a DataLoader is not loaded whole and an infinite iterator works. A re-iterable source
    shorter than ``num_iter`` (a DataLoader, a list) is iterated again; a one-shot iterator ends the test.

    With several param groups the swept lr applies to the group with the largest lr and the others
    keep their ratio to it (a head at 10x the backbone's lr stays at 10x); ``lrs`` reports that group's lr.

    Raises:
        ConfigError: bad range or iteration count; no finite loss was seen.
    """
    if not 0 < start_lr < end_lr:
        raise ConfigError(f"lr range test needs 0 < start_lr < end_lr, got {start_lr}, {end_lr}")
    if num_iter < 3:
        raise ConfigError(f"lr range test needs num_iter >= 3, got {num_iter}")
    model_state = copy.deepcopy(model.state_dict())
    opt_state = copy.deepcopy(optimizer.state_dict())
    factor = (end_lr / start_lr) ** (1.0 / (num_iter - 1))
    base = [float(g["lr"]) for g in optimizer.param_groups]
    top = max(base) if base and max(base) > 0 else 1.0
    ratios = [b / top if top else 1.0 for b in base]
    lrs: list[float] = []
    losses: list[float] = []
    avg, best = 0.0, math.inf
    was_training = model.training
    model.train()
    try:
        stream = _batches(batches, num_iter)
        for i, (inputs, targets) in enumerate(stream):
            lr = start_lr * factor**i
            for group, ratio in zip(optimizer.param_groups, ratios):
                group["lr"] = lr * ratio
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            value = float(loss.detach())
            if not math.isfinite(value):
                break
            avg = smoothing * avg + (1 - smoothing) * value
            smoothed = avg / (1 - smoothing ** (i + 1))  # bias-corrected running mean
            lrs.append(lr)
            losses.append(smoothed)
            best = min(best, smoothed)
            if smoothed > diverge_factor * best:
                break
        if stream.seen == 0:
            raise ConfigError("lr range test got no batches")
    finally:
        model.load_state_dict(model_state)
        optimizer.load_state_dict(opt_state)
        model.train(was_training)
    if len(losses) < 3:
        raise ConfigError(
            f"lr range test diverged after {len(losses)} steps", hint="lower start_lr or check the data and loss"
        )
    return LRRangeResult(lrs, losses, _steepest_descent(lrs, losses))


class _batches:
    """At most ``limit`` items of ``source``, restarting a re-iterable source that runs out early."""

    def __init__(self, source: Iterable[Any], limit: int) -> None:
        self.source = source
        self.limit = limit
        self.seen = 0

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.source)
        one_shot = it is self.source
        this_pass = 0
        while self.seen < self.limit:
            try:
                item = next(it)
            except StopIteration:
                if one_shot or this_pass == 0:  # exhausted, or a re-iteration that yields nothing
                    return
                it, this_pass = iter(self.source), 0
                continue
            self.seen += 1
            this_pass += 1
            yield item


def _steepest_descent(lrs: list[float], losses: list[float]) -> float:
    """lr where d(loss)/d(log lr) is most negative before the loss minimum.

    Slopes span a window of ~5% of the points and the first 10% are skipped, so batch-to-batch
    noise at tiny lrs (where the loss barely moves) is not mistaken for descent.
    """
    stop = losses.index(min(losses)) + 1
    window = max(1, len(losses) // 20)
    first = min(len(losses) // 10, max(0, stop - window - 1))
    logs = [math.log(lr) for lr in lrs]
    candidates = range(first, max(first + 1, stop - window))
    slope = {
        i: (losses[min(i + window, len(losses) - 1)] - losses[i]) / (logs[min(i + window, len(logs) - 1)] - logs[i])
        for i in candidates
        if logs[min(i + window, len(logs) - 1)] > logs[i]
    }
    return lrs[min(slope, key=slope.__getitem__)] if slope else lrs[stop - 1] / 10
