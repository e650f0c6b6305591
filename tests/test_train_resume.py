"""Exact resume: a run stopped (at an epoch end or mid-epoch) and resumed ends bit-identical to an uninterrupted
one, for every schedule, in fp32 and bf16, with accumulation and EMA; a killed process resumes from its last
step checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from edgedeploy.errors import ConfigError
from edgedeploy.train.config import train_config_from_dict
from edgedeploy.train.runner import run_training

DROPOUT_NET = '''
import torch
from torch import nn


def net(num_classes=2):
    """Conv + BatchNorm + dropout: weights, buffers and RNG draws all matter to a resume."""
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
        nn.Dropout(0.3), nn.Linear(4 * 8 * 8, num_classes),
    )
'''

QUIET = lambda _line: None  # noqa: E731


def _cfg(
    tmp_path, *, schedule="constant", precision="fp32", accumulate=2, ema=0.0, warmup=0, epochs=2, device="cpu",
    net=DROPOUT_NET, deterministic="auto", **ckpt,
):  # fmt: skip
    (tmp_path / "dropnet.py").write_text(net)
    rng = np.random.default_rng(0)
    x = rng.random((80, 1, 8, 8), dtype=np.float32)
    y = (x[:, 0, :4].mean(axis=(1, 2)) > x[:, 0, 4:].mean(axis=(1, 2))).astype(np.int64)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    raw = {
        "model": {"factory": "dropnet:net", "python_path": ["."]},
        "data": {"dataset": "npz", "path": "data.npz", "batch_size": 8},
        "optim": {"lr": 0.02, "schedule": schedule, "warmup_steps": warmup, "weight_decay": 0.01},
        "monitor": {"memory": False, "gradients": False},
        "run": {
            "epochs": epochs, "device": device, "threads": 1, "precision": precision,
            "accumulate": accumulate, "ema": ema, "deterministic": deterministic,
        },
        "checkpoint": ckpt,
        "deploy": {"batch": [1, 2, 4]},
    }  # fmt: skip
    return train_config_from_dict(raw, source="train.toml", base_dir=tmp_path)


def _weights(result):
    return load_file(str(result.checkpoint))


def _assert_identical(a, b):
    assert a.keys() == b.keys()
    differ = {k: float((a[k].double() - b[k].double()).abs().max()) for k in a if not torch.equal(a[k], b[k])}
    assert not differ, differ


CASES = [
    ("constant", 0, "fp32"),
    ("cosine", 0, "fp32"),
    ("onecycle", 0, "fp32"),
    ("cosine", 3, "fp32"),  # warm-up + cosine
    ("constant", 0, "bf16"),
    ("cosine", 0, "bf16"),
    ("onecycle", 0, "bf16"),
    ("cosine", 3, "bf16"),
]


def straight_and_resumed(cfg, tmp_path):
    """One uninterrupted run, and one stopped mid-epoch 1, resumed, stopped mid-epoch 2 and resumed to the end."""
    straight = run_training(cfg, tmp_path / "straight", log=QUIET)
    assert straight.state.step == 8
    run_training(cfg, tmp_path / "sliced", stop_after_steps=2, log=QUIET)  # mid-epoch 1
    lines: list[str] = []
    run_training(cfg, tmp_path / "sliced", resume=True, stop_after_steps=4, log=lines.append)  # to mid-epoch 2
    assert any("step 2, batch 4 of epoch 1" in line for line in lines), lines
    return straight, run_training(cfg, tmp_path / "sliced", resume=True, log=QUIET)


@pytest.mark.parametrize(("schedule", "warmup", "precision"), CASES)
def test_stop_and_resume_is_bit_identical_for_every_schedule(tmp_path, schedule, warmup, precision):
    """8 batches of 8 per epoch, 2 per step: 4 steps an epoch. One stop at an epoch end, one mid-epoch."""
    cfg = _cfg(tmp_path, schedule=schedule, warmup=warmup, precision=precision, ema=0.8)
    straight, resumed = straight_and_resumed(cfg, tmp_path)
    _assert_identical(_weights(straight), _weights(resumed))
    assert [h["train_loss"] for h in straight.state.history] == [h["train_loss"] for h in resumed.state.history]
    a = json.loads((tmp_path / "straight" / "model.resume.json").read_text())["train_state"]
    b = json.loads((tmp_path / "sliced" / "model.resume.json").read_text())["train_state"]
    assert a["scheduler"] == b["scheduler"] and a["amp"] == b["amp"]
    meta = json.loads((tmp_path / "straight" / "model.meta.json").read_text())
    assert meta["ema"] == {"decay": 0.8, "deployed": True}


def test_resumed_cosine_rate_is_the_uninterrupted_rate(tmp_path):
    """The rate after a resume is the closed form at that step, not a rate lowered twice."""
    cfg = _cfg(tmp_path, schedule="cosine", accumulate=1, epochs=4)
    run_training(cfg, tmp_path / "run", stop_after=2, log=QUIET)
    state = json.loads((tmp_path / "run" / "model.resume.json").read_text())
    steps = state["train_state"]["loop"]["optimizer_steps"]
    total = 4 * steps // 2
    expected = 0.02 * 0.5 * (1 + np.cos(np.pi * steps / total))
    assert state["param_groups"][0]["lr"] == pytest.approx(expected, rel=1e-12)
    assert state["train_state"]["scheduler"]["last_epoch"] == steps


def test_ema_weights_are_deployed_and_differ_from_the_trained_weights(tmp_path):
    cfg = _cfg(tmp_path, ema=0.5, epochs=1)
    result = run_training(cfg, tmp_path / "run", log=QUIET)
    deployed = _weights(result)
    resume = load_file(str(tmp_path / "run" / "model.resume.safetensors"))
    trained = {k[len("model.") :]: v for k, v in resume.items() if k.startswith("model.")}
    ema = {k[len("ema.module.") :]: v for k, v in resume.items() if k.startswith("ema.module.")}
    _assert_identical(deployed, ema)
    assert not torch.equal(deployed["5.weight"], trained["5.weight"])  # the average, not the last step
    with pytest.raises(ConfigError, match="run.ema"):
        _cfg(tmp_path, ema=1.0)


def test_resuming_from_an_epoch_end_with_accumulation_and_a_short_group(tmp_path):
    """accumulate 3 over 8 batches: groups of 3, 3, 2 per epoch (the short one rescaled)."""
    cfg = _cfg(tmp_path, schedule="onecycle", accumulate=3)
    straight = run_training(cfg, tmp_path / "straight", log=QUIET)
    run_training(cfg, tmp_path / "sliced", stop_after=1, log=QUIET)
    resumed = run_training(cfg, tmp_path / "sliced", resume=True, log=QUIET)
    _assert_identical(_weights(straight), _weights(resumed))


KILLER = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_train_resume import _cfg
from pathlib import Path
from edgedeploy.train.runner import run_training


class KillAt:
    def on_step_end(self, step, _info):
        if step + 1 == {kill_at}:
            os.kill(os.getpid(), signal.SIGKILL)


run_training(_cfg(Path({tmp!r}), schedule="cosine", every_steps=3), Path({tmp!r}) / "killed",
             callbacks=[KillAt()], log=lambda _l: None)
"""


def test_a_killed_run_resumes_from_its_last_step_checkpoint(tmp_path):
    """SIGKILL after step 7 (of 8); the step-6 checkpoint (mid-epoch 2) resumes bit-identically."""
    cfg = _cfg(tmp_path, schedule="cosine", every_steps=3)
    straight = run_training(cfg, tmp_path / "straight", log=QUIET)
    script = textwrap.dedent(KILLER).format(tests=os.path.dirname(__file__), kill_at=7, tmp=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    saved = json.loads((tmp_path / "killed" / "model.resume.json").read_text())["train_state"]["loop"]
    assert (saved["step"], saved["batch"], saved["epoch"]) == (6, 4, 1)  # the last step checkpoint
    lines: list[str] = []
    resumed = run_training(cfg, tmp_path / "killed", resume=True, log=lines.append)
    assert any("step 6, batch 4 of epoch 2" in line for line in lines), lines
    _assert_identical(_weights(straight), _weights(resumed))


@pytest.mark.slow
def test_two_rank_ddp_resumes_mid_epoch_bit_identically(tmp_path):
    """torchrun, 2 gloo ranks, cosine + accumulation + EMA + dropout: stopped mid-epoch and resumed through
    the CLI, the weights equal the uninterrupted 2-rank run's."""
    _cfg(tmp_path)  # writes dropnet.py and data.npz
    (tmp_path / "train.toml").write_text(
        textwrap.dedent(
            """
            [model]
            factory = "dropnet:net"
            [data]
            dataset = "npz"
            path = "data.npz"
            batch_size = 4
            [optim]
            lr = 0.02
            schedule = "cosine"
            warmup_steps = 2
            [monitor]
            memory = false
            gradients = false
            [run]
            epochs = 2
            device = "cpu"
            backend = "gloo"
            threads = 1
            accumulate = 2
            ema = 0.8
            [deploy]
            batch = [1, 2, 4]
            """
        )
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if os.path.isdir("/sys/class/net/lo"):
        env["GLOO_SOCKET_IFNAME"] = "lo"

    def torchrun(out: str, *flags: str) -> str:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        cmd += ["-m", "edgedeploy", "train", "--config", "train.toml", "--out", out, *flags]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stderr

    torchrun("straight")
    torchrun("sliced", "--stop-after-steps", "3")  # 4 steps an epoch: mid-epoch 1
    log = torchrun("sliced", "--resume")
    assert "step 3, batch 6 of epoch 1" in log
    saved = json.loads((tmp_path / "sliced" / "model.resume.json").read_text())["train_state"]
    assert len(saved["rng"]) == 2  # both ranks' generators
    _assert_identical(load_file(str(tmp_path / "straight" / "model.safetensors")),
                      load_file(str(tmp_path / "sliced" / "model.safetensors")))  # fmt: skip


# Tensor.put_ (accumulate=False) has no deterministic kernel, on CPU as on CUDA
PUT_NET = """
import torch
from torch import nn


class Put(nn.Module):
    def __init__(self, num_classes=2):
        super().__init__()
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        y = self.fc(x.flatten(1))
        return y.clone().put_(torch.tensor([0]), y.flatten()[:1])


def net(num_classes=2):
    return Put(num_classes)
"""


class KernelSettings:
    """Records torch's determinism settings at each optimizer step."""

    def __init__(self):
        self.seen = set()

    def on_step_end(self, _step, _info):
        self.seen.add((torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic))


@pytest.mark.parametrize(("mode", "inside"), [("auto", (True, True)), ("off", (False, False))])
def test_deterministic_kernels_are_on_during_the_run_and_given_back_after(tmp_path, mode, inside):
    settings = KernelSettings()
    run_training(_cfg(tmp_path, deterministic=mode, epochs=1), tmp_path / mode, callbacks=[settings], log=QUIET)
    assert settings.seen == {inside}
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic) == (False, False)


def test_strict_determinism_names_the_op_without_a_deterministic_kernel_and_auto_runs_it(tmp_path, capsys):
    from edgedeploy.cli import main
    from edgedeploy.errors import TargetCapabilityError

    with pytest.raises(TargetCapabilityError, match="train.toml: key 'run.deterministic' = 'strict' but put_ has no"):
        run_training(_cfg(tmp_path, net=PUT_NET, deterministic="strict"), tmp_path / "strict", log=QUIET)
    assert not torch.are_deterministic_algorithms_enabled()  # given back after a failure too
    assert not (tmp_path / "strict" / "model.safetensors").exists()
    with pytest.warns(UserWarning, match="put_ does not have a deterministic implementation"):
        run_training(_cfg(tmp_path, net=PUT_NET), tmp_path / "auto", log=QUIET)
    assert (tmp_path / "auto" / "model.safetensors").is_file()
    (tmp_path / "train.toml").write_text(
        '[model]\nfactory = "dropnet:net"\npython_path = ["."]\n[data]\ndataset = "npz"\npath = "data.npz"\n'
        '[run]\nepochs = 1\ndevice = "cpu"\ndeterministic = "strict"\n'
    )
    assert main(["train", "--config", str(tmp_path / "train.toml"), "--out", str(tmp_path / "cli")]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert "put_ has no deterministic kernel on cpu" in err[-1] and "run.deterministic = 'auto'" in err[-1]
    assert str(tmp_path / "train.toml") in err[-1]
    with pytest.raises(ConfigError, match="run.deterministic"):
        _cfg(tmp_path, deterministic="yes")


def test_a_resume_in_another_precision_is_refused_naming_the_one_it_started_with(tmp_path):
    from edgedeploy.errors import CheckpointError

    run_training(_cfg(tmp_path), tmp_path / "run", stop_after_steps=2, log=QUIET)  # fp32
    with pytest.raises(CheckpointError, match="saved by a run training in fp32; this run trains in bf16") as err:
        run_training(_cfg(tmp_path, precision="bf16"), tmp_path / "run", resume=True, log=QUIET)
    assert "run.precision = 'fp32'" in err.value.hint
    assert run_training(_cfg(tmp_path), tmp_path / "run", resume=True, log=QUIET).state.step == 8  # as it started
