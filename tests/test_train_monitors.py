"""Gradient-flow monitor: vanishing on a deep sigmoid MLP but not on its residual twin, exploding, no-grad."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from edgedeploy.train.monitors import GradientFlowMonitor, lightning_callback


class SigmoidMLP(nn.Module):
    def __init__(self, depth: int = 24, width: int = 16, residual: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            y = torch.sigmoid(layer(x))
            x = x + y if self.residual else y
        return x


def _backward_report(model: nn.Module, monitor: GradientFlowMonitor):
    torch.manual_seed(1)
    monitor.attach(model)
    model(torch.randn(8, 16)).sum().backward()
    return monitor.check(step=0)


def test_vanishing_fires_on_deep_sigmoid_mlp_not_on_residual_twin():
    torch.manual_seed(0)
    plain = SigmoidMLP(residual=False)
    twin = SigmoidMLP(residual=True)
    twin.load_state_dict(plain.state_dict())  # same weights: only the skip connections differ
    plain_report = _backward_report(plain, GradientFlowMonitor(vanishing=1e-7))
    twin_report = _backward_report(twin, GradientFlowMonitor(vanishing=1e-7))
    assert "layers.0" in plain_report.layers("vanishing")
    assert plain_report.layer_norms["layers.0"] < 1e-7 < plain_report.layer_norms["layers.23"]
    assert twin_report.layers("vanishing") == []
    assert min(twin_report.layer_norms.values()) > 1e-3


def test_exploding_non_finite_and_missing_gradients():
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(4, 4)
            self.unused = nn.Linear(4, 4)
            self.frozen = nn.Linear(4, 4).requires_grad_(False)

        def forward(self, x):
            return self.used(x)

    model = TwoHeads()
    monitor = GradientFlowMonitor(exploding=10.0).attach(model)
    (model(torch.randn(2, 4)) * 1e4).sum().backward()
    report = monitor.check(step=3)
    assert report.kinds() == {"exploding", "no_grad"}
    assert report.layers("exploding") == ["used"]
    assert report.layers("no_grad") == ["unused"]  # frozen parameters are not expected to get gradients
    model.zero_grad()
    (model(torch.full((2, 4), float("inf")))).sum().backward()
    assert "non_finite" in monitor.check().kinds()
    # grad_scale divides recorded norms (hooks see loss-scaled gradients under a GradScaler)
    # (a fixed input: the unscaled norm is ~4.1 here, ~4.1e4 as the hooks see it)
    model.zero_grad()
    (model(torch.full((2, 4), 0.1)) * 1e4).sum().backward()
    assert monitor.check(grad_scale=1e4).layers("exploding") == []
    monitor.detach()


def test_loop_callback_checks_every_n_steps_and_reports_through_log():
    lines: list[str] = []
    model = SigmoidMLP(depth=24)
    monitor = GradientFlowMonitor(every=2, log=lines.append).attach(model)
    reports = []
    for step in range(4):
        model(torch.randn(4, 16)).sum().backward()
        reports.append(monitor.on_after_backward(step, model))
    assert [r is not None for r in reports] == [False, True, False, True]
    assert any("vanishing" in line and "layers.0" in line for line in lines)


def test_lightning_adapter_says_how_to_install_when_absent(monkeypatch):
    import sys

    for name in ("lightning", "lightning.pytorch", "pytorch_lightning"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed, also where it is
    with pytest.raises(ImportError, match=r"edgedeploy\[lightning\]"):
        lightning_callback(GradientFlowMonitor())
    from edgedeploy.train.lightning import lightning_module

    with pytest.raises(ImportError, match=r"edgedeploy\[lightning\]"):
        lightning_module(torch.nn.Linear(2, 2))


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="Lightning not installed (optional)")
def test_lightning_adapter_is_a_callback():  # pragma: no cover - runs only where Lightning is installed
    from lightning.pytorch import Callback

    cb = lightning_callback(GradientFlowMonitor())
    assert isinstance(cb, Callback) and hasattr(cb, "on_after_backward")
