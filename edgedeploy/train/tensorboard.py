"""TensorBoard logging as a loop callback: losses, learning rate, gradient norms and histograms.

``tensorboard`` (the ``SummaryWriter`` backend) is imported lazily: ``pip install 'edgedeploy[viz]'``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from edgedeploy.errors import ConfigError


class TensorBoardLogger:
    """Writes ``train/loss`` and ``train/lr`` per optimizer step, ``train/grad_norm`` (true, unscaled
    global L2 norm) per step, ``grad/<param>`` histograms every ``every`` steps, and every epoch
    metric under ``epoch/<name>``.

    Raises:
        ConfigError: tensorboard is not installed.
    """

    def __init__(self, logdir: str | Path, every: int = 50, histograms: bool = True) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "monitor.tensorboard = true needs tensorboard", hint="pip install 'edgedeploy[viz]'"
            ) from None
        self.writer = SummaryWriter(log_dir=str(logdir))
        self.every = max(1, int(every))
        self.histograms = histograms

    def on_after_backward(self, step: int, model: nn.Module, grad_scale: float = 1.0) -> None:
        grads = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
        if not grads:
            return
        sq = sum(float(g.detach().float().pow(2).sum()) for _, g in grads)
        norm = math.sqrt(sq) / grad_scale
        if math.isfinite(norm):
            self.writer.add_scalar("train/grad_norm", norm, step)
        if self.histograms and step % self.every == 0:
            for name, g in grads:
                values = g.detach().float().cpu() / grad_scale
                if torch.isfinite(values).all():
                    self.writer.add_histogram(f"grad/{name}", values, step)

    def on_step_end(self, step: int, values: dict[str, float]) -> None:
        self.writer.add_scalar("train/loss", values["loss"], step)
        self.writer.add_scalar("train/lr", values["lr"], step)

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if key != "epoch" and isinstance(value, (int, float)):
                self.writer.add_scalar(f"epoch/{key}", float(value), epoch)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
