"""Model factories that ship with the package, so a checkpoint's ``factory`` imports anywhere."""

from __future__ import annotations

from torch import nn

from edgedeploy.train.blocks import ResidualBlock, init_weights


class DigitsCNN(nn.Module):
    """Small residual CNN for 8x8 single-channel digits: stem, two residual stages, pooled linear head."""

    def __init__(self, channels: int = 32, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU()
        )
        self.stage1 = ResidualBlock(channels, channels)
        self.stage2 = ResidualBlock(channels, 2 * channels, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(2 * channels, num_classes)
        init_weights(self)

    def forward(self, x):
        x = self.stage2(self.stage1(self.stem(x)))
        return self.head(self.pool(x).flatten(1))


def digits_cnn(channels: int = 32, num_classes: int = 10, in_channels: int = 1) -> DigitsCNN:
    """Factory for ``examples/digits`` (``edgedeploy.train.models:digits_cnn``)."""
    return DigitsCNN(channels, num_classes, in_channels)
