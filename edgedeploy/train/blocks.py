"""Building blocks: a residual block with a parameter-free shortcut, and a weight-init policy."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ResidualBlock(nn.Module):
    """``relu(conv2(relu(bn(conv1(x)))) + shortcut(x))``.

    When stride or channels change, the shortcut subsamples spatially and zero-pads the new channels
    (no 1x1 conv, so no extra parameters). The last conv starts at zero (``zero_init_last``), so the
    block starts as its shortcut, which keeps gradients flowing through deep stacks.

    Raises:
        ValueError: ``out_channels < in_channels`` (a zero-padding shortcut cannot drop channels).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, norm: bool = True) -> None:
        super().__init__()
        if out_channels < in_channels:
            raise ValueError(f"ResidualBlock needs out_channels >= in_channels, got {in_channels} -> {out_channels}")
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=not norm)
        self.bn1 = nn.BatchNorm2d(out_channels) if norm else nn.Identity()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.zero_init_last()

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        extra = self.out_channels - self.in_channels
        return F.pad(x, [0, 0, 0, 0, 0, extra]) if extra else x

    def zero_init_last(self) -> None:
        """Zero the residual branch's last layer so the block starts as the identity (on its shortcut)."""
        nn.init.zeros_(self.conv2.weight)
        if self.conv2.bias is not None:
            nn.init.zeros_(self.conv2.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.conv2(out)
        return F.relu(out + self.shortcut(x))


@torch.no_grad()
def init_weights(model: nn.Module) -> nn.Module:
    """Initialisation policy: Xavier for Linear, Kaiming (fan_out, relu) for Conv, ones/zeros for norms.

    Blocks that define ``zero_init_last()`` are re-zeroed afterwards, so the policy does not undo
    residual identity initialisation. Returns ``model`` for chaining.
    """
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight, gain=nn.init.calculate_gain("relu"))
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm)):
            if m.weight is not None:
                nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    for m in model.modules():
        zero_init_last = getattr(m, "zero_init_last", None)
        if callable(zero_init_last):
            zero_init_last()
    return model
