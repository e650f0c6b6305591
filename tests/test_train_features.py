"""Trainer features, each a train.toml key: model selection (validation split, best / top-k, early stopping),
no weight decay on norms and biases, channels_last, frozen BatchNorm statistics, the CSV logger, the LR finder
from the config and the CLI."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from test_train_resume import _cfg

from edgedeploy.errors import ConfigError
from edgedeploy.train.config import train_config_from_dict
from edgedeploy.train.runner import _optimizer, build_model, run_training

QUIET = lambda _line: None  # noqa: E731


def _with(cfg_tmp, **sections):
    """A train config like test_train_resume's, with sections' keys replaced."""
    tmp_path = cfg_tmp
    base = _cfg(tmp_path, accumulate=1, epochs=6)
    raw = {
        "model": {"factory": base.model.factory, "python_path": ["."]},
        "data": {"dataset": "npz", "path": "data.npz", "batch_size": 8},
        "optim": {"lr": 0.02},
        "monitor": {"memory": False, "gradients": False},
        "run": {"epochs": 6, "device": "cpu", "threads": 1},
        "deploy": {"batch": [1, 2, 4]},
    }
    for section, keys in sections.items():
        raw.setdefault(section, {}).update(keys)
    return train_config_from_dict(raw, source="train.toml", base_dir=tmp_path)


def test_validation_split_best_top_k_and_early_stopping(tmp_path):
    cfg = _with(
        tmp_path,
        data={"val_fraction": 0.25},
        checkpoint={"save_best": True, "top_k": 2, "monitor": "val_loss"},
        run={"early_stop_patience": 2, "early_stop_min_delta": 0.05},
        monitor={"csv": True},
    )
    lines: list[str] = []
    result = run_training(cfg, tmp_path / "run", log=lines.append)
    history = result.state.history
    assert "64 train" not in lines[0] and "48 train" in lines[0]  # 16 of the 64 train samples validate
    assert all({"val_loss", "val_accuracy", "test_loss", "test_accuracy"} <= h.keys() for h in history)
    # early stopping: 2 epochs without a 0.05 improvement end the run before epoch 6
    best, since = float("inf"), 0
    for h in history:
        best, since = (h["val_loss"], 0) if h["val_loss"] < best - 0.05 else (best, since + 1)
    assert since == 2 and len(history) < 6, [h["val_loss"] for h in history]
    assert any("early stop" in line for line in lines)
    ranked = sorted(history, key=lambda h: h["val_loss"])
    best_meta = json.loads((tmp_path / "run" / "model.best.meta.json").read_text())
    assert best_meta["selection"] == {
        "monitor": "val_loss", "mode": "min", "epoch": ranked[0]["epoch"], "value": ranked[0]["val_loss"]
    }  # fmt: skip
    kept = sorted(p.name for p in (tmp_path / "run").glob("model.epoch*.safetensors"))
    assert kept == sorted(f"model.epoch{h['epoch']}.safetensors" for h in ranked[:2])
    best_weights = load_file(str(tmp_path / "run" / "model.best.safetensors"))
    top = load_file(str(tmp_path / "run" / f"model.epoch{ranked[0]['epoch']}.safetensors"))
    assert all(torch.equal(best_weights[k], top[k]) for k in top)
    with (tmp_path / "run" / "model.metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [float(r["val_loss"]) for r in rows] == [h["val_loss"] for h in history]
    with pytest.raises(ConfigError, match="needs a validation split"):
        _with(tmp_path, checkpoint={"save_best": True})
    with pytest.raises(ConfigError, match="not a metric"):
        _with(tmp_path, data={"val_fraction": 0.2}, checkpoint={"save_best": True, "monitor": "test_accuracy"})


def test_no_weight_decay_on_norm_and_bias_parameters(tmp_path):
    cfg = _with(tmp_path, optim={"weight_decay": 0.1})
    model = build_model(cfg)
    groups = _optimizer(cfg, model, torch.nn.CrossEntropyLoss()).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = sorted(names[id(p)] for p in groups[0]["params"])
    exempt = sorted(names[id(p)] for p in groups[1]["params"])
    assert (groups[0]["weight_decay"], groups[1]["weight_decay"]) == (0.1, 0.0)
    assert decayed == ["0.weight", "5.weight"] and exempt == ["0.bias", "1.bias", "1.weight", "5.bias"]
    # the effect: a BatchNorm gain with no gradient keeps its value only where it is exempt
    plain = _with(tmp_path, optim={"weight_decay": 0.1, "norm_bias_decay": True})
    assert len(_optimizer(plain, build_model(plain), torch.nn.CrossEntropyLoss()).param_groups) == 1
    for c, kept in ((cfg, True), (plain, False)):
        m = build_model(c)
        opt = _optimizer(c, m, torch.nn.CrossEntropyLoss())
        for p in m.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        assert torch.equal(m[1].weight, torch.ones(4)) is kept


def test_channels_last_trains_the_same_model(tmp_path):
    seen = []

    class Probe:
        def on_after_backward(self, step, model, grad_scale=1.0):
            seen.append(model[0].weight.is_contiguous(memory_format=torch.channels_last))

    plain = run_training(_with(tmp_path, run={"epochs": 1}), tmp_path / "plain", log=QUIET)
    fast = run_training(
        _with(tmp_path, run={"epochs": 1, "channels_last": True}), tmp_path / "cl", log=QUIET, callbacks=[Probe()]
    )
    assert seen and all(seen)
    a, b = load_file(str(plain.checkpoint)), load_file(str(fast.checkpoint))
    # the conv bias before BatchNorm gets a ~0 gradient (BatchNorm removes it) that Adam normalises to +-lr
    # whatever rounding order gave; it and the running mean (an average of biased batch means) are free
    free = {"0.bias", "1.running_mean"}
    assert all(torch.allclose(a[k].float(), b[k].float(), atol=1e-5) for k in a.keys() - free)


def test_frozen_batchnorm_keeps_its_statistics(tmp_path):
    held = run_training(_with(tmp_path, run={"epochs": 1, "freeze": ["1"]}), tmp_path / "held", log=QUIET)
    drift = run_training(
        _with(tmp_path, run={"epochs": 1, "freeze": ["1"], "freeze_bn_stats": False}), tmp_path / "drift", log=QUIET
    )
    h, d = load_file(str(held.checkpoint)), load_file(str(drift.checkpoint))
    assert torch.equal(h["1.running_mean"], torch.zeros(4)) and torch.equal(h["1.running_var"], torch.ones(4))
    assert not torch.equal(d["1.running_mean"], torch.zeros(4))


def test_lr_finder_from_the_config_and_the_cli(tmp_path):
    cfg = _with(tmp_path, optim={"find_lr": True, "find_lr_iters": 12}, run={"epochs": 1})
    lines: list[str] = []
    run_training(cfg, tmp_path / "run", log=lines.append)
    found = json.loads((tmp_path / "run" / "lr_finder.json").read_text())
    assert len(found["lrs"]) == 12 and any("lr finder: suggested lr" in line for line in lines)
    state = json.loads((tmp_path / "run" / "model.resume.json").read_text())
    assert state["param_groups"][0]["lr"] == pytest.approx(found["suggested_lr"])  # trained at the suggestion
    (tmp_path / "train.toml").write_text(
        '[model]\nfactory = "dropnet:net"\n[data]\ndataset = "npz"\npath = "data.npz"\nbatch_size = 8\n'
        '[optim]\nfind_lr_iters = 10\n[monitor]\nmemory = false\n[run]\ndevice = "cpu"\nthreads = 1\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "edgedeploy", "train", "--config", "train.toml", "--out", "cli", "--find-lr"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "LR FINDER: suggested lr" in proc.stdout
    assert (tmp_path / "cli" / "lr_finder.json").is_file() and not (tmp_path / "cli" / "model.safetensors").exists()


@pytest.mark.slow
def test_sync_batchnorm_on_cpu_ranks_is_refused_in_one_line(tmp_path):
    """torch's SyncBatchNorm runs on GPUs only: 2 CPU ranks asked for it stop before training, naming the key."""
    import os

    _cfg(tmp_path)
    (tmp_path / "train.toml").write_text(
        '[model]\nfactory = "dropnet:net"\n[data]\ndataset = "npz"\npath = "data.npz"\nbatch_size = 8\n'
        '[monitor]\nmemory = false\n[run]\ndevice = "cpu"\nbackend = "gloo"\nthreads = 1\nsync_batchnorm = true\n'
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if os.path.isdir("/sys/class/net/lo"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "edgedeploy", "train", "--config", "train.toml", "--out", "run"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode != 0  # the worker exits 4 (TargetCapabilityError); torchrun reports a failure
    assert "run.sync_batchnorm' needs CUDA devices" in proc.stderr
    assert not (tmp_path / "run" / "model.safetensors").exists()
