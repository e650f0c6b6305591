"""DDP under torchrun on CPU (gloo): identical replicas, one checkpoint, rank-0-only logging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from safetensors.torch import load_file

from edgedeploy.train.distributed import param_digest
from edgedeploy.train.models import digits_cnn


@pytest.mark.slow
@pytest.mark.parametrize("ema", [0.0, 0.9])  # EMA: its BatchNorm statistics synced too, not each rank's own
def test_two_process_torchrun_gloo_ends_with_identical_weights_and_one_checkpoint(tmp_path, ema):
    rng = np.random.default_rng(0)
    x = rng.random((64, 1, 8, 8), dtype=np.float32)
    y = (x[:, 0, :4].mean(axis=(1, 2)) > 0.5).astype(np.int64)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    (tmp_path / "train.toml").write_text(
        textwrap.dedent(
            """
            [model]
            factory = "edgedeploy.train.models:digits_cnn"
            kwargs = { channels = 4, num_classes = 2 }
            [data]
            dataset = "npz"
            path = "data.npz"
            batch_size = 8
            [optim]
            lr = 0.01
            [monitor]
            memory = false
            [run]
            epochs = 2
            device = "cpu"
            backend = "gloo"
            threads = 1
            """
        )
        + f"ema = {ema}\n"
    )
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if os.path.isdir("/sys/class/net/lo"):
        # gloo picks the interface the hostname resolves to; on shared CI hosts that is sometimes not
        # reachable from the other rank, so pin both ranks to loopback
        env["GLOO_SOCKET_IFNAME"] = "lo"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "edgedeploy", "train", "--config", str(tmp_path / "train.toml"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # exactly one checkpoint, written by rank 0
    assert sorted(p.name for p in out.glob("*.meta.json")) == ["model.meta.json"]
    weights = [p.name for p in out.glob("*.safetensors") if not p.name.endswith(".resume.safetensors")]
    assert weights == ["model.safetensors"]
    meta = json.loads((out / "model.meta.json").read_text())
    digests = meta["distributed"]["replica_digests"]
    assert meta["distributed"]["world_size"] == 2 and len(digests) == 2
    assert digests[0] == digests[1]  # each rank hashed its own weights: the replicas agree
    model = digits_cnn(channels=4, num_classes=2)
    model.load_state_dict(load_file(str(out / "model.safetensors")))
    assert param_digest(model) == digests[0]  # and the file holds those weights
    # each rank saw half the data: 64 samples * 0.8 train split / 2 ranks / batch 8 -> 4 steps per epoch
    assert meta["metrics"]["world_size"] == 2
    state = json.loads((out / "model.resume.json").read_text())["train_state"]["loop"]
    assert state["step"] == 2 * 4
    # only rank 0 logs progress
    assert proc.stderr.count("deploy train:") == 1
    assert proc.stderr.count("epoch 2/2") == 1
    # rank 0's summary survives the workers' early exit (flushed before os._exit), and only rank 0 prints it
    assert proc.stdout.count("TRAINED: 2 epochs") == 1


def test_leave_distributed_worker_flushes_then_exits_without_finalizing(monkeypatch, capsys):
    from edgedeploy.commands import train as train_command

    class Left(Exception):
        pass

    calls = []
    monkeypatch.setattr(sys.stdout, "flush", lambda: calls.append("stdout"))
    monkeypatch.setattr(sys.stderr, "flush", lambda: calls.append("stderr"))

    def fake_exit(code):
        calls.append(code)
        raise Left

    monkeypatch.setattr(os, "_exit", fake_exit)
    with pytest.raises(Left):
        train_command.leave_distributed_worker(0)
    # output flushed first (logging's handlers too), then the process ends with the code given
    assert calls[-1] == 0 and {"stdout", "stderr"} <= set(calls[:-1])
