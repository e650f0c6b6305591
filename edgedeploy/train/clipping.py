"""Gradient clipping by global norm or by value, chosen from config."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from edgedeploy.errors import ConfigError

ClipMode = Literal["none", "norm", "value"]


@dataclass(frozen=True)
class GradClipper:
    """Clip gradients in place; call after unscaling and before the optimizer step.

    Attributes:
        mode: ``none``, ``norm`` (``clip_grad_norm_``) or ``value`` (``clip_grad_value_``).
        max_norm: norm limit for ``norm`` mode.
        norm_type: p of the p-norm for ``norm`` mode (``inf`` allowed).
        clip_value: absolute limit per element for ``value`` mode.
    """

    mode: ClipMode = "none"
    max_norm: float = 1.0
    norm_type: float = 2.0
    clip_value: float = 0.5

    def __post_init__(self) -> None:
        if self.mode not in ("none", "norm", "value"):
            raise ConfigError(f"grad clip mode {self.mode!r} is not allowed", hint="use none, norm or value")
        if self.mode == "norm" and not self.max_norm > 0:
            raise ConfigError(f"grad clip max_norm must be > 0, got {self.max_norm}")
        if self.mode == "value" and not self.clip_value > 0:
            raise ConfigError(f"grad clip clip_value must be > 0, got {self.clip_value}")

    def __call__(self, params: Iterable[nn.Parameter]) -> float:
        """Clip and return the total gradient norm before clipping (``nan`` in ``value``/``none`` mode)."""
        params = [p for p in params if p.grad is not None]
        if not params or self.mode == "none":
            return math.nan
        if self.mode == "norm":
            return float(torch.nn.utils.clip_grad_norm_(params, self.max_norm, norm_type=self.norm_type))
        torch.nn.utils.clip_grad_value_(params, self.clip_value)
        return math.nan
