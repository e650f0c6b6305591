"""Model factories that ship with the package, so a checkpoint's ``factory`` imports anywhere.

``deploy build`` takes a sidecar's factory from this module without ``model.trust_sidecar_code``
(the package zoo), so models users train with ``deploy train`` and deploy belong here. Factories
take ``temperature=`` (``loss.export_temperature = 'output'``): the model then returns
``(logits, softmax(logits / T))``. Heavy dependencies (transformers) are imported inside factories.
"""

from __future__ import annotations

import torch
from torch import nn

from edgedeploy.train.blocks import ResidualBlock, init_weights


def _with_probabilities(logits: torch.Tensor, temperature: float | None) -> torch.Tensor | tuple[torch.Tensor, ...]:
    if temperature is None:
        return logits
    return logits, torch.softmax(logits.float() / temperature, dim=-1)


class DigitsCNN(nn.Module):
    """Small residual CNN for 8x8 single-channel digits: stem, two residual stages, pooled linear head."""

    def __init__(
        self, channels: int = 32, num_classes: int = 10, in_channels: int = 1, temperature: float | None = None
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU()
        )
        self.stage1 = ResidualBlock(channels, channels)
        self.stage2 = ResidualBlock(channels, 2 * channels, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(2 * channels, num_classes)
        self.temperature = temperature
        init_weights(self)

    def forward(self, x):
        x = self.stage2(self.stage1(self.stem(x)))
        return _with_probabilities(self.head(self.pool(x).flatten(1)), self.temperature)


def digits_cnn(
    channels: int = 32, num_classes: int = 10, in_channels: int = 1, temperature: float | None = None
) -> DigitsCNN:
    """Factory for ``examples/digits`` (``edgedeploy.train.models:digits_cnn``)."""
    return DigitsCNN(channels, num_classes, in_channels, temperature)


class MLP(nn.Module):
    """Flatten, ``len(hidden)`` ReLU layers, linear head: for tabular or small flattened inputs."""

    def __init__(
        self, in_features: int, hidden: list[int] | tuple[int, ...] = (64,), num_classes: int = 10,
        temperature: float | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, num_classes)
        self.temperature = temperature

    def forward(self, x):
        return _with_probabilities(self.head(self.body(x)), self.temperature)


def mlp(
    in_features: int, hidden: list[int] | tuple[int, ...] = (64,), num_classes: int = 10,
    temperature: float | None = None,
) -> MLP:  # fmt: skip
    """Factory ``edgedeploy.train.models:mlp``."""
    return MLP(in_features, tuple(hidden), num_classes, temperature)
