"""Fixes from issue 16: exact resume with skipped steps, GradScaler growth counter, keep_fp32 under
deepcopy/pickle, a streaming lr range test keeping group ratios, the clamped uncertainty loss, and
the exported temperature."""

from __future__ import annotations

import copy
import itertools
import json
import math
import pickle

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from edgedeploy.train.amp import MixedPrecision, keep_fp32
from edgedeploy.train.config import train_config_from_dict
from edgedeploy.train.distributed import launch
from edgedeploy.train.losses import UncertaintyWeightedLoss
from edgedeploy.train.lr_finder import lr_range_test
from edgedeploy.train.runner import run_training

INF_MODEL = '''
import torch
from torch import nn


class InfNet(nn.Module):
    """A linear model whose gradients turn infinite on any batch holding a marked sample (x[0] > 50)."""

    def __init__(self, num_classes=2):
        super().__init__()
        self.body = nn.Linear(64, 16)
        self.head = nn.Linear(16, num_classes)

    def forward(self, x):
        out = self.head(torch.relu(self.body(x.flatten(1))))
        if out.requires_grad and bool((x.flatten(1)[:, 0] > 50).any()):
            out.register_hook(lambda g: g * float("inf"))
        return out


def inf_net(num_classes=2):
    return InfNet(num_classes)
'''


def _inf_cfg(tmp_path, precision: str):
    (tmp_path / "infmodel.py").write_text(INF_MODEL)
    rng = np.random.default_rng(0)
    x = rng.random((96, 1, 8, 8), dtype=np.float32)
    y = (x[:, 0, :4].mean(axis=(1, 2)) > x[:, 0, 4:].mean(axis=(1, 2))).astype(np.int64)
    x[[3, 40, 77], 0, 0, 0] = 100.0  # three marked samples: some batches of every epoch skip
    np.savez(tmp_path / "data.npz", x=x, y=y)
    raw = {
        "model": {"factory": "infmodel:inf_net", "python_path": ["."]},
        "data": {"dataset": "npz", "path": "data.npz", "batch_size": 16, "normalize": False},
        "optim": {"lr": 0.05, "schedule": "onecycle"},
        "monitor": {"memory": False, "gradients": False},
        "run": {"epochs": 4, "device": "cpu", "threads": 1, "precision": precision},
    }
    return train_config_from_dict(raw, source="train.toml", base_dir=tmp_path)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_resume_with_skipped_steps_is_bit_identical(tmp_path, precision):
    cfg = _inf_cfg(tmp_path, precision)
    quiet = lambda _l: None  # noqa: E731
    straight = run_training(cfg, tmp_path / "straight", log=quiet)
    skipped = sum(h["skipped_steps"] for h in straight.state.history)
    assert skipped >= 4  # the run really skipped steps
    assert straight.state.optimizer_steps == straight.state.step - skipped
    run_training(cfg, tmp_path / "sliced", stop_after=1, log=quiet)
    run_training(cfg, tmp_path / "sliced", stop_after=2, resume=True, log=quiet)
    resumed = run_training(cfg, tmp_path / "sliced", resume=True, log=quiet)
    a, b = load_file(str(straight.checkpoint)), load_file(str(resumed.checkpoint))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), {k: float((a[k] - b[k]).abs().max()) for k in a}
    amp_a = json.loads((tmp_path / "straight" / "model.resume.json").read_text())["train_state"]["amp"]
    amp_b = json.loads((tmp_path / "sliced" / "model.resume.json").read_text())["train_state"]["amp"]
    assert amp_a == amp_b  # scale, growth counter, skipped count


def test_skipped_step_restarts_the_scaler_growth_counter():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    amp = MixedPrecision(torch.device("cpu"), "fp16", init_scale=1024.0, growth_interval=2)
    fabric = launch(amp.device, 0, precision=amp.plugin)  # as deploy train does: backward goes through Fabric

    def step(inf: bool) -> bool:
        fabric.backward(model(torch.randn(3, 4)).sum())
        if inf:
            model.weight.grad[0, 0] = float("inf")
        return amp.step(opt)

    assert step(False) and amp.scale == 1024.0  # one good step: counter 1 of 2
    assert not step(True) and amp.scale == 512.0  # skip: backoff, counter back to 0
    assert amp.scaler.state_dict()["_growth_tracker"] == 0
    assert step(False) and amp.scale == 512.0  # a stale counter would grow here already
    assert step(False) and amp.scale == 1024.0  # two good steps in a row since the skip


def _fp32_island_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    assert keep_fp32(model) == ["1"]
    return model


def test_keep_fp32_survives_deepcopy_and_pickle():
    model = _fp32_island_model()
    x = torch.randn(3, 4)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        model[1].weight.mul_(3.0)  # change the original only
        model[1].bias.add_(1.0)
    # the copy computes with its own LayerNorm weights, not the original's
    ref = nn.functional.layer_norm(twin[0](x), (4,), twin[1].weight, twin[1].bias)
    assert torch.allclose(twin[1](twin[0](x)), ref)
    assert not torch.allclose(model[1](model[0](x)), ref)
    restored = pickle.loads(pickle.dumps(model))
    assert torch.equal(restored(x), model(x))
    for m in (twin, restored):
        assert m[1].forward.module is m[1]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert m[1](torch.randn(3, 4, dtype=torch.bfloat16)).dtype == torch.float32  # still an FP32 island


def _lr_problem():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(
        [{"params": model[0].parameters(), "lr": 1e-3}, {"params": model[2].parameters(), "lr": 1e-2}], lr=1e-3
    )
    return model, opt


def test_lr_range_test_streams_an_infinite_iterator_and_keeps_group_ratios():
    model, opt = _lr_problem()
    drawn = itertools.count()

    def forever():
        g = torch.Generator().manual_seed(0)
        while True:
            next(drawn)
            x = torch.randn(8, 4, generator=g)
            yield x, (x[:, 0] > 0).long()

    seen: list[tuple[float, float]] = []
    opt.register_step_pre_hook(lambda o, *_: seen.append((o.param_groups[0]["lr"], o.param_groups[1]["lr"])))
    result = lr_range_test(model, forever(), opt, nn.functional.cross_entropy, num_iter=12, diverge_factor=1e9)
    assert next(drawn) == 12  # exactly num_iter batches drawn from an endless stream
    assert len(result.lrs) == 12
    assert all(b / a == pytest.approx(10.0) for a, b in seen)  # backbone:head ratio kept
    assert [b for _, b in seen] == pytest.approx(result.lrs)  # the reported lr is the top group's
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 1e-2]  # restored


def test_lr_range_test_reiterates_a_short_loader():
    model, opt = _lr_problem()
    x = torch.randn(16, 4)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8)
    result = lr_range_test(model, loader, opt, nn.functional.cross_entropy, num_iter=7, diverge_factor=1e9)
    assert len(result.lrs) == 7


def test_uncertainty_loss_clamps_log_variances_and_has_a_param_group():
    loss_fn = UncertaintyWeightedLoss(2, log_var_range=(-5.0, 5.0))
    with torch.no_grad():
        loss_fn.log_vars.copy_(torch.tensor([-100.0, 100.0]))
    total = loss_fn(torch.tensor(1.0), torch.tensor(1.0))
    assert math.isfinite(total.item())
    assert total.item() == pytest.approx(math.exp(5) - 5 + math.exp(-5) + 5)
    assert loss_fn.weights.tolist() == pytest.approx([math.exp(5), math.exp(-5)])
    model = nn.Linear(2, 2)
    opt = torch.optim.AdamW([{"params": model.parameters()}, *loss_fn.param_groups(0.1)], lr=1e-3, weight_decay=0.1)
    assert opt.param_groups[1]["params"] == [loss_fn.log_vars]
    assert opt.param_groups[1]["lr"] == 0.1 and opt.param_groups[1]["weight_decay"] == 0.0
    with pytest.raises(ValueError, match="low < high"):
        UncertaintyWeightedLoss(2, log_var_range=(1.0, 1.0))


def _temperature_cfg(tmp_path, export: str):
    rng = np.random.default_rng(0)
    x = rng.random((96, 1, 8, 8), dtype=np.float32)
    y = (x[:, 0, :4].mean(axis=(1, 2)) > x[:, 0, 4:].mean(axis=(1, 2))).astype(np.int64)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    raw = {
        "model": {"factory": "edgedeploy.train.models:mlp", "kwargs": {"in_features": 64, "num_classes": 2}},
        "data": {"dataset": "npz", "path": "data.npz", "batch_size": 16},
        "loss": {"kind": "temperature_ce", "temperature": 2.0, "temperature_lr": 0.1, "export_temperature": export},
        "monitor": {"memory": False},
        "run": {"epochs": 2, "device": "cpu", "threads": 1},
    }
    return train_config_from_dict(raw, source="train.toml", base_dir=tmp_path)


@pytest.mark.parametrize("export", ["fold", "output", "none"])
def test_learned_temperature_reaches_the_deployed_model(tmp_path, export):
    from edgedeploy.config import config_from_dict
    from edgedeploy.modelio.checkpoint import load_model

    cfg = _temperature_cfg(tmp_path, export)
    result = run_training(cfg, tmp_path / "run", log=lambda _l: None)
    meta = json.loads(result.checkpoint.with_suffix(".meta.json").read_text())
    T = meta["temperature"]["value"]
    assert T != pytest.approx(2.0) and T == pytest.approx(result.metrics["temperature"])
    trained_state = json.loads((tmp_path / "run" / "model.resume.json").read_text())["train_state"]
    deploy = config_from_dict({"model": {"checkpoint": str(result.checkpoint)}, "build": {"target": "cpu"}})
    deployed = load_model(deploy, result.checkpoint)
    # what training computed: the plain model's logits divided by the learned T
    from edgedeploy.train.models import mlp

    plain = mlp(64, num_classes=2).eval()
    weights = load_file(str(result.checkpoint))
    if export == "fold":
        layer = trained_state["folded_temperature"]["layer"]
        weights = {k: v * T if k.startswith(layer + ".") else v for k, v in weights.items()}  # unfold
    plain.load_state_dict(weights)
    x = torch.randn(5, 1, 8, 8)
    training_probs = torch.softmax(plain(x) / T, dim=-1)
    with torch.no_grad():
        out = deployed(x)
    if export == "fold":
        assert meta["outputs"] == ["logits"]
        assert torch.allclose(torch.softmax(out, -1), training_probs, atol=1e-5)
    elif export == "output":
        assert meta["outputs"] == ["logits", "probabilities"] and meta["factory_kwargs"]["temperature"] == T
        assert torch.allclose(out[1], training_probs, atol=1e-6)
    else:
        assert not torch.allclose(torch.softmax(out, -1), training_probs, atol=1e-3)  # raw logits: T not applied


def test_a_finished_folded_run_resumes_unfolded(tmp_path):
    """The fold is applied to a copy for X.safetensors: a finished folded run continued to 3 epochs gives, bit
    for bit, what 3 epochs straight give, and resuming it with nothing left to train leaves its weights as they
    are."""
    import dataclasses

    cfg = _temperature_cfg(tmp_path, "fold")
    more = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, epochs=3))
    straight = run_training(more, tmp_path / "straight", log=lambda _l: None)
    run_training(cfg, tmp_path / "run", log=lambda _l: None)
    finished = (tmp_path / "run" / "model.safetensors").read_bytes()
    run_training(cfg, tmp_path / "run", resume=True, log=lambda _l: None)  # nothing left to train
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == finished
    lines: list[str] = []
    second = run_training(more, tmp_path / "run", resume=True, log=lines.append)
    assert second.state.epoch == 3 and any("folded into" in line for line in lines)
    a, b = load_file(str(straight.checkpoint)), load_file(str(second.checkpoint))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_unfinished_run_keeps_its_temperature_unfolded_and_says_so(tmp_path):
    """A run stopped before its last epoch is resumed, not deployed: its weights stay unfolded, and the sidecar
    says what they hold (not what the config asks of a finished run)."""
    cfg = _temperature_cfg(tmp_path, "fold")
    lines: list[str] = []
    result = run_training(cfg, tmp_path / "run", stop_after=1, log=lines.append)
    meta = json.loads(result.checkpoint.with_suffix(".meta.json").read_text())
    assert meta["temperature"]["export"] == "not folded: the run is unfinished"
    trained_state = json.loads((tmp_path / "run" / "model.resume.json").read_text())["train_state"]
    assert "folded_temperature" not in trained_state and not any("folded into" in line for line in lines)


BOUNDED = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU())
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        return 4 * torch.tanh(self.head(self.body(x)))  # bounded logits: the head is not the last op


def net():
    return Net()
"""


def test_a_model_the_temperature_cannot_fold_into_fails_before_training(tmp_path):
    """``export_temperature = 'fold'`` is tried on a copy before the first epoch: a head behind a tanh fails at
    once (exit 2, naming the fix), not after the last epoch with the run's work lost."""
    from edgedeploy.errors import ConfigError

    (tmp_path / "bounded.py").write_text(BOUNDED)
    cfg = _temperature_cfg(tmp_path, "fold")
    import dataclasses

    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, factory="bounded:net", kwargs={}))
    lines: list[str] = []
    with pytest.raises(ConfigError, match="does not divide the logits by T"):
        run_training(cfg, tmp_path / "run", log=lines.append)
    assert not any(line.startswith("epoch") for line in lines), lines
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_an_out_that_is_a_file_is_refused_before_training(tmp_path):
    from edgedeploy.errors import ConfigError

    (tmp_path / "model.safetensors").write_bytes(b"an earlier checkpoint")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        run_training(_temperature_cfg(tmp_path, "none"), tmp_path / "model.safetensors", log=lambda _l: None)
    assert (tmp_path / "model.safetensors").read_bytes() == b"an earlier checkpoint"


def test_the_sidecar_names_one_class_per_model_output(tmp_path):
    """Names counted from the labels are completed to the model's outputs; names given must match them."""
    import dataclasses

    from edgedeploy.errors import ConfigError

    cfg = _temperature_cfg(tmp_path, "none")
    cfg = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, kind="cross_entropy"))
    named = dataclasses.replace(cfg, deploy=dataclasses.replace(cfg.deploy, class_names=("a", "b", "c")))
    with pytest.raises(ConfigError, match="3 class names .a, b, c. for a model with 2 outputs"):
        run_training(named, tmp_path / "named", log=lambda _l: None)
    wider = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, kwargs={"in_features": 64, "num_classes": 3}))
    result = run_training(wider, tmp_path / "wider", log=lambda _l: None)  # the labels hold classes 0 and 1 only
    meta = json.loads(result.checkpoint.with_suffix(".meta.json").read_text())
    assert meta["class_names"] == ["0", "1", "2"]
