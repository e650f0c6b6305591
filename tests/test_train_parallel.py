"""torchrun on CPU (gloo): FSDP2 shards and matches DDP, DDP runs exit cleanly one after another,
two "nodes" meet through a c10d rendezvous on 127.0.0.1, and WebDataset shards train on 2 ranks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from safetensors.torch import load_file

TOML = """
[model]
factory = "edgedeploy.train.models:mlp"
kwargs = {{ in_features = 64, num_classes = 2, hidden = [16] }}
[data]
dataset = "npz"
path = "data.npz"
batch_size = 8
[optim]
name = "sgd"
lr = 0.1
[monitor]
memory = false
gradients = false
[run]
epochs = {epochs}
device = "cpu"
backend = "gloo"
threads = 1
strategy = "{strategy}"
"""


def _project(tmp_path, strategy: str = "ddp", epochs: int = 2):
    rng = np.random.default_rng(0)
    x = rng.random((64, 64), dtype=np.float32)
    y = (x[:, :32].mean(1) > x[:, 32:].mean(1)).astype(np.int64)
    np.savez(tmp_path / "data.npz", x=x[:48], y=y[:48], x_test=x[48:], y_test=y[48:])
    toml = tmp_path / f"{strategy}.toml"
    toml.write_text(TOML.format(strategy=strategy, epochs=epochs))
    return toml


def _env():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _torchrun(args: list[str], toml, out, cwd, timeout: int = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", *args, "-m", "edgedeploy", "train"]
    cmd += ["--config", str(toml), "--out", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=cwd)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two torchrun jobs: ~45 s on a shared 2-core machine
def test_fsdp_shards_parameters_and_matches_ddp(tmp_path):
    standalone = ["--standalone", "--nproc_per_node", "2"]
    ddp = _torchrun(standalone, _project(tmp_path, "ddp"), tmp_path / "ddp", tmp_path)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    fsdp = _torchrun(standalone, _project(tmp_path, "fsdp"), tmp_path / "fsdp", tmp_path)
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    meta = json.loads((tmp_path / "fsdp" / "model.meta.json").read_text())["distributed"]
    assert meta["strategy"] == "fsdp" and meta["replica_digests"][0] == meta["replica_digests"][1]
    total = meta["param_numel"]
    assert total == 64 * 16 + 16 + 16 * 2 + 2
    assert meta["rank0_param_numel_held"] <= total // 2 + 16  # rank 0 held a shard, not the model
    ddp_meta = json.loads((tmp_path / "ddp" / "model.meta.json").read_text())["distributed"]
    assert ddp_meta["rank0_param_numel_held"] == total
    a, b = (
        load_file(str(tmp_path / "ddp" / "model.safetensors")),
        load_file(str(tmp_path / "fsdp" / "model.safetensors")),
    )
    diff = {k: float((a[k] - b[k]).abs().max()) for k in a}
    assert max(diff.values()) < 1e-5, diff  # same data-parallel maths, sharded storage


@pytest.mark.slow  # two torchrun agents: ~50 s on a shared 2-core machine
def test_two_nodes_meet_through_a_c10d_rendezvous(tmp_path):
    toml = _project(tmp_path, "ddp", epochs=1)
    port = _free_port()
    common = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d"]
    common += ["--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "edgedeploy-test"]
    cmd = lambda rank: [  # noqa: E731
        sys.executable, "-m", "torch.distributed.run", *common, "--node_rank", str(rank),
        "-m", "edgedeploy", "train", "--config", str(toml), "--out", str(tmp_path / "run"),
    ]  # fmt: skip
    nodes = [
        subprocess.Popen(cmd(r), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
        for r in (0, 1)
    ]
    outs = [n.communicate(timeout=240) for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    meta = json.loads((tmp_path / "run" / "model.meta.json").read_text())
    assert meta["distributed"]["world_size"] == 2
    assert len(set(meta["distributed"]["replica_digests"])) == 1
    # each node trained on half the 48 samples: 24 / batch 8 = 3 steps
    assert json.loads((tmp_path / "run" / "model.resume.json").read_text())["train_state"]["loop"]["step"] == 3


@pytest.mark.slow
def test_ten_ddp_runs_in_a_row_all_exit_0(tmp_path):
    toml = _project(tmp_path, "ddp", epochs=1)
    runs = int(os.environ.get("EDGEDEPLOY_DDP_RUNS", "10"))
    codes = []
    for i in range(runs):
        proc = _torchrun(["--standalone", "--nproc_per_node", "2"], toml, tmp_path / f"run{i}", tmp_path)
        codes.append(proc.returncode)
        assert "terminate called" not in proc.stderr, proc.stderr[-2000:]
    assert codes == [0] * runs


@pytest.mark.slow
def test_webdataset_shards_on_two_ranks_match_single_process_accuracy(tmp_path):
    from tests.test_train_data import make_shards

    make_shards(tmp_path / "shards", 40, shards=4, test_every=4)
    toml = tmp_path / "wds.toml"
    toml.write_text(
        textwrap.dedent(
            """
            [model]
            factory = "edgedeploy.train.models:mlp"   # no BatchNorm: per-rank batch statistics would differ
            kwargs = { in_features = 256, hidden = [64], num_classes = 3 }
            [data]
            dataset = "webdataset"
            path = "shards/train-{00..03}.tar"
            test_path = "shards/test-00.tar"
            image_size = [16, 16]
            channels = 1
            batch_size = 8
            [optim]
            lr = 0.01
            [monitor]
            memory = false
            [run]
            epochs = 10
            device = "cpu"
            backend = "gloo"
            threads = 1
            """
        )
    )
    single = subprocess.run(
        [sys.executable, "-m", "edgedeploy", "train", "--config", str(toml), "--out", str(tmp_path / "one")],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=tmp_path,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-2000:]
    # same effective batch (2 ranks x 4 = 8) and so the same number of steps as the single process
    toml2 = tmp_path / "wds2.toml"
    toml2.write_text(toml.read_text().replace("batch_size = 8", "batch_size = 4"))
    two = _torchrun(["--standalone", "--nproc_per_node", "2"], toml2, tmp_path / "two", tmp_path, timeout=400)
    assert two.returncode == 0, two.stderr[-2000:]
    acc1 = json.loads((tmp_path / "one" / "model.meta.json").read_text())["metrics"]["test_accuracy"]
    acc2 = json.loads((tmp_path / "two" / "model.meta.json").read_text())["metrics"]["test_accuracy"]
    assert acc1 >= 0.85 and acc2 >= 0.85 and abs(acc1 - acc2) <= 0.1, (acc1, acc2)
