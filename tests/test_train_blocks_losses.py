"""Residual block, init policy and the two losses."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from edgedeploy.train.blocks import ResidualBlock, init_weights
from edgedeploy.train.losses import TemperatureCrossEntropy, UncertaintyWeightedLoss


def test_residual_block_starts_as_its_zero_padding_shortcut():
    torch.manual_seed(0)
    x = torch.rand(2, 4, 8, 8)  # non-negative: relu(shortcut) == shortcut
    same = ResidualBlock(4, 4)
    assert torch.equal(same(x), x)
    down = ResidualBlock(4, 6, stride=2)
    y = down(x)
    assert y.shape == (2, 6, 4, 4)
    assert torch.equal(y[:, :4], x[:, :, ::2, ::2]) and torch.count_nonzero(y[:, 4:]) == 0
    n_params = sum(p.numel() for p in down.parameters())
    assert n_params == sum(p.numel() for m in (down.conv1, down.bn1, down.conv2) for p in m.parameters())
    with pytest.raises(ValueError, match="out_channels >= in_channels"):
        ResidualBlock(8, 4)


def test_init_policy_per_layer_type_and_keeps_residual_zero_init():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.LayerNorm(4), nn.Linear(256, 128), ResidualBlock(16, 16))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.3)
    init_weights(model)
    conv, ln, lin, block = model
    fan_out = 16 * 3 * 3
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2.0 / fan_out), rel=0.2)  # kaiming fan_out
    assert torch.count_nonzero(conv.bias) == 0
    assert torch.equal(ln.weight, torch.ones(4)) and torch.count_nonzero(ln.bias) == 0
    bound = math.sqrt(2.0) * math.sqrt(6.0 / (256 + 128))  # xavier uniform, relu gain
    assert lin.weight.abs().max().item() <= bound and lin.weight.abs().max().item() > 0.9 * bound
    assert torch.count_nonzero(block.conv2.weight) == 0 and torch.count_nonzero(block.conv1.weight) > 0


def test_temperature_cross_entropy_matches_definition_and_learns_temperature():
    torch.manual_seed(0)
    logits, targets = torch.randn(16, 5) * 4, torch.randint(0, 5, (16,))
    weights = [1.0, 2.0, 0.5, 1.0, 3.0]
    loss_fn = TemperatureCrossEntropy(temperature=2.0, class_weights=weights)
    expected = F.cross_entropy(logits / 2.0, targets, weight=torch.tensor(weights))
    assert loss_fn(logits, targets).item() == pytest.approx(expected.item(), rel=1e-5)
    assert loss_fn.temperature == pytest.approx(2.0)
    # overconfident wrong logits: learning the temperature raises it and lowers the loss
    logits = torch.randn(64, 5) * 10
    targets = torch.randint(0, 5, (64,))
    loss_fn = TemperatureCrossEntropy(temperature=1.0)
    opt = torch.optim.SGD([g["params"][0] for g in loss_fn.param_groups(lr=0.1)], lr=0.1)
    first = loss_fn(logits, targets).item()
    for _ in range(50):
        opt.zero_grad()
        loss_fn(logits, targets).backward()
        opt.step()
    assert loss_fn.temperature > 1.5 and loss_fn(logits, targets).item() < first
    fixed = TemperatureCrossEntropy(temperature=1.0, learnable=False)
    assert fixed.param_groups(lr=0.1) == [] and not list(fixed.parameters())
    with pytest.raises(ValueError):
        TemperatureCrossEntropy(temperature=0.0)


def test_uncertainty_weighting_learns_log_losses():
    loss_fn = UncertaintyWeightedLoss(2)
    losses = (torch.tensor(4.0), torch.tensor(0.25))
    assert loss_fn(*losses).item() == pytest.approx(4.25)  # s = 0 at start: plain sum
    opt = torch.optim.Adam(loss_fn.parameters(), lr=0.05)
    for _ in range(600):
        opt.zero_grad()
        loss_fn(*losses).backward()
        opt.step()
    # optimum of exp(-s) L + s is s = log L: the noisier task gets the smaller weight
    assert loss_fn.log_vars.detach().tolist() == pytest.approx([math.log(4.0), math.log(0.25)], abs=0.05)
    assert loss_fn.weights[0] < loss_fn.weights[1]
    with pytest.raises(ValueError, match="expected 2"):
        loss_fn(torch.tensor(1.0))
