"""[run] options checked by their effect: accumulate, freeze, compile, graph, TensorBoard, DDP options."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from edgedeploy.errors import ConfigError
from edgedeploy.train.config import train_config_from_dict
from edgedeploy.train.runner import run_training

QUIET = lambda _l: None  # noqa: E731
MLP = {"factory": "edgedeploy.train.models:mlp", "kwargs": {"in_features": 64, "hidden": [16], "num_classes": 2}}


def _cfg(tmp_path, data=None, run=None, monitor=None, optim=None):
    if not (tmp_path / "data.npz").exists():
        rng = np.random.default_rng(0)
        x = rng.random((160, 64), dtype=np.float32)
        y = (x[:, :32].mean(1) > x[:, 32:].mean(1)).astype(np.int64)
        np.savez(tmp_path / "data.npz", x=x[:128], y=y[:128], x_test=x[128:], y_test=y[128:])
    raw = {
        "model": MLP,
        "data": {"dataset": "npz", "path": "data.npz", "batch_size": 32, **(data or {})},
        "optim": {"name": "sgd", "lr": 0.1, "momentum": 0.9, **(optim or {})},
        "monitor": {"memory": False, **(monitor or {})},
        "run": {"epochs": 2, "device": "cpu", "threads": 1, **(run or {})},
    }
    return train_config_from_dict(raw, source="train.toml", base_dir=tmp_path)


def _weights(result):
    return load_file(str(result.checkpoint))


def test_accumulate_4_of_batch_8_matches_batch_32(tmp_path):
    big = run_training(_cfg(tmp_path), tmp_path / "b32", log=QUIET)
    acc = run_training(_cfg(tmp_path, {"batch_size": 8}, {"accumulate": 4}), tmp_path / "b8x4", log=QUIET)
    plain8 = run_training(_cfg(tmp_path, {"batch_size": 8}), tmp_path / "b8", log=QUIET)
    assert acc.state.step == big.state.step == 2 * 128 // 32  # one optimizer step per 4 batches
    a, b, c = _weights(big), _weights(acc), _weights(plain8)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a), {k: float((a[k] - b[k]).abs().max()) for k in a}
    assert not all(torch.allclose(a[k], c[k], atol=1e-3) for k in a)  # batch 8 without accumulation differs


def test_freeze_keeps_matching_weights_unchanged(tmp_path):
    from edgedeploy.train.models import mlp

    result = run_training(_cfg(tmp_path, run={"freeze": ["body"]}), tmp_path / "f", log=QUIET)
    torch.manual_seed(0)  # the runner seeds with run.seed before building the model
    init = mlp(64, [16], 2).state_dict()
    w = _weights(result)
    assert torch.equal(w["body.1.weight"], init["body.1.weight"]) and torch.equal(w["body.1.bias"], init["body.1.bias"])
    assert not torch.equal(w["head.weight"], init["head.weight"])  # the rest trained
    meta = json.loads(result.checkpoint.with_suffix(".meta.json").read_text())
    assert meta["frozen"] == ["body.1.bias", "body.1.weight"]
    with pytest.raises(ConfigError, match=r"'run.freeze' pattern 'encoder\.\*' matches no parameter"):
        run_training(_cfg(tmp_path, run={"freeze": ["encoder.*"]}), tmp_path / "x", log=QUIET)
    with pytest.raises(ConfigError, match="froze every parameter"):
        run_training(_cfg(tmp_path, run={"freeze": ["*"]}), tmp_path / "y", log=QUIET)


def test_compile_runs_the_compiled_graph_and_falls_back_loudly(tmp_path):
    from torch._dynamo.utils import counters

    eager = run_training(_cfg(tmp_path, run={"epochs": 1}), tmp_path / "eager", log=QUIET)
    counters.clear()
    compiled = run_training(
        _cfg(tmp_path, run={"epochs": 1, "compile": True, "compile_backend": "aot_eager"}), tmp_path / "c", log=QUIET
    )
    assert compiled.metrics["compiled"] is True and not eager.metrics["compiled"]
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo captured graphs: the compiled model ran
    a, b = _weights(eager), _weights(compiled)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)  # same training, other execution
    lines: list[str] = []
    fallback = run_training(
        _cfg(tmp_path, run={"epochs": 1, "compile": True, "compile_backend": "no_such_backend"}), tmp_path / "f",
        log=lines.append,
    )  # fmt: skip
    assert fallback.metrics["compiled"] is False
    assert any("torch.compile (backend 'no_such_backend') unavailable, training eagerly" in ln for ln in lines)


def test_graph_dump_names_every_trainable_parameter(tmp_path):
    result = run_training(
        _cfg(tmp_path, run={"epochs": 1, "graph": True, "freeze": ["head.bias"]}), tmp_path / "g", log=QUIET
    )
    dot = (tmp_path / "g" / "model.dot").read_text()
    assert dot.startswith("digraph")
    for name in ("body.1.weight", "body.1.bias", "head.weight"):
        assert name in dot
    assert "head.bias" not in dot  # frozen: no gradient path, so not in the autograd graph
    assert result.state.epoch == 1


def test_tensorboard_logs_losses_lr_grad_norms_and_histograms(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _cfg(tmp_path, run={"epochs": 2}, monitor={"tensorboard": True, "every": 2}, optim={"schedule": "cosine"})
    result = run_training(cfg, tmp_path / "tb", log=QUIET)
    acc = EventAccumulator(str(tmp_path / "tb" / "tensorboard"), size_guidance={"histograms": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    assert {"train/loss", "train/lr", "train/grad_norm", "epoch/train_loss"} <= set(tags["scalars"])
    assert "grad/head.weight" in tags["histograms"] and "grad/body.1.weight" in tags["histograms"]
    lrs = [e.value for e in acc.Scalars("train/lr")]
    assert len(lrs) == result.state.step == 8 and lrs[0] == pytest.approx(0.1) and lrs[-1] < lrs[0]  # cosine decay
    epoch_losses = [e.value for e in acc.Scalars("epoch/train_loss")]
    assert epoch_losses == pytest.approx([h["train_loss"] for h in result.state.history], rel=1e-6)
    assert len(acc.Histograms("grad/head.weight")) == 4  # every 2nd of 8 steps
    assert all(e.value > 0 for e in acc.Scalars("train/grad_norm"))


def _one_rank_torchrun(monkeypatch) -> None:
    """The environment torchrun gives a job of one rank (Fabric then runs DDP over a group of one)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    torchrun.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID="test")
    for key, value in torchrun.items():
        monkeypatch.setenv(key, value)


def test_ddp_options_reach_distributed_data_parallel(monkeypatch):
    import torch.distributed as dist

    from edgedeploy.train.config import DDPSection
    from edgedeploy.train.distributed import cleanup, launch, unwrap
    from edgedeploy.train.models import mlp

    _one_rank_torchrun(monkeypatch)
    opts = DDPSection(find_unused_parameters=True, static_graph=True, gradient_as_bucket_view=True)
    fabric = launch(torch.device("cpu"), 0, "gloo", ddp=vars(opts))  # as deploy train passes [run.ddp]
    try:
        assert dist.is_initialized() and dist.get_backend() == "gloo"  # Fabric joined torchrun's group
        module = mlp(64, [8], 2)
        wrapped = fabric.setup_module(module)  # as deploy train wraps the model on 2+ ranks
        ddp = wrapped._forward_module
        assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel) and unwrap(wrapped) is module
        assert ddp.find_unused_parameters and ddp.static_graph and ddp.gradient_as_bucket_view
        del ddp, wrapped
    finally:
        cleanup(fabric)
    assert not dist.is_initialized()


def test_bf16_ddp_model_trains_through_fabrics_backward(monkeypatch):
    from edgedeploy.train.amp import MixedPrecision
    from edgedeploy.train.distributed import cleanup, launch
    from edgedeploy.train.models import mlp

    _one_rank_torchrun(monkeypatch)
    cpu = torch.device("cpu")
    amp = MixedPrecision(cpu, "bf16")
    fabric = launch(cpu, 0, "gloo", precision=amp.plugin)
    try:
        model = fabric.setup_module(mlp(64, [8], 2))  # as deploy train wraps the model on 2+ ranks
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = [p.detach().clone() for p in model.parameters()]
        with amp.autocast():
            logits = model(torch.randn(4, 64))
        assert logits.dtype == torch.float32  # Fabric's forward ran in bf16 and handed fp32 back
        # as deploy train does: Fabric's DDP wrapper refuses a plain loss.backward()
        fabric.backward(torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 0, 1])))
        assert amp.step(opt) is True
        assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    finally:
        cleanup(fabric)
