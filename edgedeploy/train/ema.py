"""Exponential moving average of the weights (``run.ema``), on ``torch.optim.swa_utils.AveragedModel``."""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


class WeightEMA:
    """``ema = decay * ema + (1 - decay) * weights`` after every optimizer step taken.

    Floating-point buffers (BatchNorm running statistics) are averaged like the parameters; integer
    buffers (``num_batches_tracked``) are copied. The first update copies the weights.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
        self.averaged.requires_grad_(False)

    @property
    def module(self) -> nn.Module:
        """The averaged model (same state-dict keys as the trained one)."""
        return self.averaged.module

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.averaged.update_parameters(model)
        for mine, theirs in zip(self.module.buffers(), model.buffers(), strict=True):
            if not (mine.is_floating_point() or mine.is_complex()):
                mine.copy_(theirs)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The averaged weights and the update count, as plain tensors."""
        state = {f"module.{k}": v for k, v in self.module.state_dict().items()}
        state["n_averaged"] = self.averaged.n_averaged
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Raises: RuntimeError: the state does not fit the model."""
        self.module.load_state_dict({k[len("module.") :]: v for k, v in state.items() if k.startswith("module.")})
        self.averaged.n_averaged.copy_(state["n_averaged"])
