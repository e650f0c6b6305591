"""Losses: temperature-scaled cross-entropy and uncertainty-weighted multi-task loss."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class TemperatureCrossEntropy(nn.Module):
    """Cross-entropy on ``logits / T`` with a learnable temperature ``T`` and optional class weights.

    ``T`` is stored as ``log T`` so it stays positive under any optimizer step. Give it its own
    learning rate with :meth:`param_groups`.

    Raises:
        ValueError: ``temperature`` is not > 0.
    """

    def __init__(
        self,
        temperature: float = 1.0,
        class_weights: Sequence[float] | torch.Tensor | None = None,
        learnable: bool = True,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        log_t = torch.tensor(math.log(temperature), dtype=torch.float32)
        if learnable:
            self.log_temperature = nn.Parameter(log_t)
        else:
            self.register_buffer("log_temperature", log_t)
        weights = None if class_weights is None else torch.as_tensor(class_weights, dtype=torch.float32)
        self.register_buffer("class_weights", weights)
        self.label_smoothing = label_smoothing

    @property
    def temperature(self) -> float:
        return float(self.log_temperature.detach().exp())

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        scaled = logits.float() / self.log_temperature.exp()
        weights: torch.Tensor | None = self.class_weights  # type: ignore[assignment]  # buffer or None
        weight = None if weights is None else weights.to(logits.device)
        return F.cross_entropy(scaled, targets, weight=weight, label_smoothing=self.label_smoothing)

    def param_groups(self, lr: float) -> list[dict]:
        """Optimizer group for the temperature with its own learning rate (empty if not learnable)."""
        return [{"params": [self.log_temperature], "lr": lr, "weight_decay": 0.0}] if self.learnable else []

    @property
    def learnable(self) -> bool:
        return isinstance(self.log_temperature, nn.Parameter)


class UncertaintyWeightedLoss(nn.Module):
    """Multi-task loss ``sum_i exp(-s_i) * L_i + s_i`` with learned log-variances ``s_i`` (Kendall et al.).

    ``exp(-s_i)`` weights each task by its learned precision; the ``+ s_i`` term stops the weights
    collapsing to zero. For a fixed loss ``L_i`` the optimum is ``s_i = log L_i``.

    The log-variances are clamped to ``log_var_range`` in the forward: a task whose loss reaches ~0
    would otherwise drive ``s_i`` to -inf and its weight ``exp(-s_i)`` to inf (then NaN, or one task
    swamping the rest in fp16). Outside the range the gradient to ``s_i`` is zero, so it stays put.
    Put the log-variances in the optimizer with :meth:`param_groups` (no weight decay: decay would
    pull every task towards weight 1).

    Raises:
        ValueError: the number of losses passed differs from ``num_tasks``; an empty clamp range.
    """

    def __init__(self, num_tasks: int, log_var_range: tuple[float, float] = (-6.0, 6.0)) -> None:
        super().__init__()
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
        if not log_var_range[0] < log_var_range[1]:
            raise ValueError(f"log_var_range must be (low, high) with low < high, got {log_var_range}")
        self.log_vars = nn.Parameter(torch.zeros(num_tasks))
        self.log_var_range = (float(log_var_range[0]), float(log_var_range[1]))

    def clamped(self) -> torch.Tensor:
        """The log-variances as used: clamped to ``log_var_range``."""
        return self.log_vars.clamp(*self.log_var_range)

    def forward(self, *losses: torch.Tensor) -> torch.Tensor:
        if len(losses) != len(self.log_vars):
            raise ValueError(f"expected {len(self.log_vars)} task losses, got {len(losses)}")
        stacked = torch.stack([loss.float().reshape(()) for loss in losses])
        s = self.clamped()
        return (torch.exp(-s) * stacked + s).sum()

    def param_groups(self, lr: float | None = None) -> list[dict]:
        """An optimizer group for the log-variances: weight decay 0, and its own ``lr`` when given.

        ``torch.optim.Adam([{"params": model.parameters()}, *loss.param_groups(1e-2)], lr=1e-3)``.
        """
        group: dict = {"params": [self.log_vars], "weight_decay": 0.0}
        if lr is not None:
            group["lr"] = lr
        return [group]

    @property
    def weights(self) -> torch.Tensor:
        """Current task weights ``exp(-s_i)`` (of the clamped log-variances)."""
        return torch.exp(-self.clamped().detach())
