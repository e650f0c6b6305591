"""Mixed precision (torch.amp), the safe optimizer step, FP32 islands and gradient clipping."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from edgedeploy.errors import ConfigError, TargetCapabilityError
from edgedeploy.train.amp import FP32Softmax, MixedPrecision, keep_fp32, resolve_precision
from edgedeploy.train.clipping import GradClipper


def _fabric(amp: MixedPrecision) -> Any:
    """Fabric with ``amp``'s precision plugin, launched as deploy train does: backward goes through it."""
    from edgedeploy.train.distributed import launch

    return launch(amp.device, 0, precision=amp.plugin)


def _model_and_opt() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_safe_step_skips_on_injected_inf_and_backs_off_the_scale():
    model, opt = _model_and_opt()
    amp = MixedPrecision(torch.device("cpu"), "fp16", init_scale=1024.0)
    fabric = _fabric(amp)
    assert amp.scaler.is_enabled()
    before = [p.detach().clone() for p in model.parameters()]
    fabric.backward(model(torch.randn(3, 4)).sum())
    model[0].weight.grad[0, 0] = float("inf")
    assert amp.step(opt) is False
    assert amp.skipped_steps == 1
    assert amp.scale == pytest.approx(512.0)
    assert all(p.grad is None for p in model.parameters())  # zeroed
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # not stepped
    # the next, finite step goes through and changes the weights
    fabric.backward(model(torch.randn(3, 4)).sum())
    assert amp.step(opt) is True
    assert amp.skipped_steps == 1 and amp.steps == 2
    assert not torch.equal(before[0], model[0].weight)


def test_safe_step_without_scaler_also_refuses_nan():
    model, opt = _model_and_opt()
    amp = MixedPrecision(torch.device("cpu"), "bf16")
    fabric = _fabric(amp)
    assert not amp.scaler.is_enabled() and amp.scale == 1.0
    fabric.backward(model(torch.randn(3, 4)).sum())
    model[2].bias.grad[0] = float("nan")
    w = model[2].weight.detach().clone()
    assert amp.step(opt) is False and amp.skipped_steps == 1
    assert torch.equal(w, model[2].weight)


def test_scaled_gradients_are_unscaled_before_clipping():
    x = torch.randn(3, 4)
    reference, _ = _model_and_opt()
    reference(x).sum().backward()
    expected = torch.cat([p.grad.flatten() for p in reference.parameters()]).norm().item()
    model, opt = _model_and_opt()
    amp = MixedPrecision(torch.device("cpu"), "fp16", init_scale=2.0**10)
    fabric = _fabric(amp)
    seen = []
    fabric.backward(model(x).sum())
    amp.step(opt, clip=lambda ps: seen.append(torch.cat([p.grad.flatten() for p in ps]).norm().item()))
    assert seen == [pytest.approx(expected, rel=1e-5)]  # the clipper saw true, not 1024x, gradients


def test_auto_precision_and_cpu_autocast_dtype():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == "bf16"
    amp = MixedPrecision(cpu, "auto")
    assert amp.precision == "bf16" and not amp.scaler.is_enabled()
    with amp.autocast():
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="fp64"):
        resolve_precision("fp64", cpu)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_cuda_device_is_not_silently_replaced():
    from edgedeploy.train.config import train_config_from_dict
    from edgedeploy.train.runner import run_training

    cfg = train_config_from_dict({"model": {"factory": "x:y"}, "run": {"device": "cuda"}})
    with pytest.raises(TargetCapabilityError, match="no CUDA device"):
        run_training(cfg, "unused")


def test_training_without_lightning_names_the_extra_to_install(monkeypatch, tmp_path):
    import sys

    from edgedeploy.train.config import train_config_from_dict
    from edgedeploy.train.runner import run_training

    monkeypatch.setitem(sys.modules, "lightning.fabric", None)  # what a missing package looks like to import
    cfg = train_config_from_dict({"model": {"factory": "x:y"}, "run": {"device": "cpu", "precision": "bf16"}})
    with pytest.raises(ConfigError, match="Lightning Fabric") as info:
        run_training(cfg, tmp_path)
    assert info.value.hint == "pip install 'edgedeploy[lightning]'"
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_fabric_plugin_carries_our_scaler_and_fp16_stays_fp16_on_cpu():
    amp = MixedPrecision(torch.device("cpu"), "fp16", init_scale=256.0, growth_interval=3)
    fabric = _fabric(amp)
    assert amp.plugin.scaler is amp.scaler and amp.scale == 256.0  # Fabric scales with the configured scaler
    with amp.autocast():
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.float16  # not swapped for bf16
    model, opt = _model_and_opt()
    fabric.backward(model(torch.randn(3, 4)).sum())
    grad = model[2].bias.grad.clone()
    assert amp.step(opt) is True and grad.abs().max() > 100  # the backward was scaled (x256)


def test_keep_fp32_runs_chosen_layers_in_fp32_inside_autocast():
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 3), nn.Softmax(-1))
    x = torch.randn(2, 4)
    with torch.amp.autocast(device_type="cpu", dtype=torch.bfloat16):
        assert model[1](model[0](x)).dtype == torch.bfloat16  # autocast would run LayerNorm in bf16
    keys = list(model.state_dict())
    changed = keep_fp32(model)
    assert changed == ["1", "3"]
    assert list(model.state_dict()) == keys  # checkpoints unaffected
    with torch.amp.autocast(device_type="cpu", dtype=torch.bfloat16):
        assert model[1](model[0](x)).dtype == torch.float32
        assert model[2](x.new_ones(2, 6)).dtype == torch.bfloat16  # the rest still autocasts
        assert FP32Softmax()(torch.randn(2, 3).bfloat16()).dtype == torch.float32
    with pytest.raises(ConfigError, match="nope"):
        keep_fp32(model, names=["nope"])


def test_clip_by_norm_and_by_value():
    p = nn.Parameter(torch.zeros(4))
    p.grad = torch.tensor([3.0, 4.0, 0.0, 0.0])
    total = GradClipper("norm", max_norm=1.0)([p])
    assert total == pytest.approx(5.0)
    assert p.grad.norm().item() == pytest.approx(1.0, rel=1e-4)
    p.grad = torch.tensor([3.0, -4.0, 0.1, 0.0])
    GradClipper("value", clip_value=0.5)([p])
    assert p.grad.tolist() == pytest.approx([0.5, -0.5, 0.1, 0.0])
    p.grad = torch.tensor([3.0, 4.0, 0.0, 0.0])
    GradClipper("none")([p])
    assert p.grad.tolist() == [3.0, 4.0, 0.0, 0.0]
    with pytest.raises(ConfigError):
        GradClipper("norm", max_norm=0.0)
