"""Lightning: a real Trainer.fit with the GradMonitor callback, and the adapter's deployable checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader, TensorDataset

pytest.importorskip("lightning")


def _loaders():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(96, 64, generator=g)
    y = (x[:, :32].mean(1) > x[:, 32:].mean(1)).long()
    train = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=16, shuffle=True, generator=g)
    return train, DataLoader(TensorDataset(x[64:], y[64:]), batch_size=32)


def test_trainer_fit_runs_the_grad_monitor_and_writes_a_deployable_checkpoint(tmp_path):
    import lightning.pytorch as pl

    from edgedeploy.config import config_from_dict
    from edgedeploy.modelio.checkpoint import load_model
    from edgedeploy.train.lightning import deploy_checkpoint_callback, lightning_module
    from edgedeploy.train.models import mlp
    from edgedeploy.train.monitors import GradientFlowMonitor, lightning_callback

    torch.manual_seed(0)
    net = mlp(64, [16], 2)
    net.body[1].weight.requires_grad_(False)  # frozen: the monitor must not expect a gradient there
    monitor = GradientFlowMonitor(vanishing=1e-12, exploding=1e6, every=2, log=lambda _l: None)
    ckpt = tmp_path / "model.safetensors"
    kwargs = {"in_features": 64, "hidden": [16], "num_classes": 2}
    inputs = [{"name": "x", "shape": ["batch", 64], "dtype": "float32", "range": [0.0, 1.0]}]
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=0.5,
        gradient_clip_algorithm="norm", accumulate_grad_batches=2,
        callbacks=[
            lightning_callback(monitor),
            deploy_checkpoint_callback(
                ckpt, factory="edgedeploy.train.models:mlp", factory_kwargs=kwargs, inputs=inputs
            ),
        ],
    )  # fmt: skip
    module = lightning_module(net, lr=0.01)
    module.unused = torch.nn.Linear(3, 3)  # a branch forward never calls: the monitor reports it
    train, val = _loaders()
    trainer.fit(module, train, val)
    assert trainer.global_step == 2 * 64 // 16 // 2  # accumulate_grad_batches=2 -> 4 optimizer steps
    # the callback ran inside Trainer.fit, on real gradients: norms for every trained layer, the dead branch flagged
    assert monitor.reports, "GradMonitor never ran"
    last = monitor.reports[-1]
    assert set(last.layer_norms) == {"model.body.1", "model.head"} and all(v > 0 for v in last.layer_norms.values())
    assert last.layers("no_grad") == ["unused"]
    # the checkpoint: the network the factory rebuilds (not the LightningModule with its dead branch), plain
    # keys, and a sidecar the deploy side reads
    weights = load_file(str(ckpt))
    assert set(weights) == set(net.state_dict())
    assert torch.equal(weights["head.weight"], net.head.weight.detach())
    meta = json.loads(ckpt.with_suffix(".meta.json").read_text())
    assert meta["trainer"] == "lightning" and 0.0 <= meta["metrics"]["val_accuracy"] <= 1.0
    cfg = config_from_dict({"model": {"checkpoint": str(ckpt)}, "build": {"target": "cpu"}})
    deployed = load_model(cfg, ckpt)
    x = torch.rand(4, 64)
    net.eval()
    assert torch.allclose(deployed(x), net(x), atol=1e-6)


def test_grad_monitor_in_lightning_gives_no_false_vanishing_warning_at_step_0():
    """digits_cnn's residual blocks start with a zero-initialised last conv: their first convs get exactly 0
    gradient before the first update. Checked every step, the monitor must stay quiet until it can judge."""
    import lightning.pytorch as pl

    from edgedeploy.train.lightning import lightning_module
    from edgedeploy.train.models import digits_cnn
    from edgedeploy.train.monitors import GradientFlowMonitor, lightning_callback

    torch.manual_seed(0)
    x = torch.rand(32, 1, 8, 8)
    y = (x[:, 0, :4].mean((1, 2)) > x[:, 0, 4:].mean((1, 2))).long()
    lines: list[str] = []
    monitor = GradientFlowMonitor(every=1, log=lines.append)
    trainer = pl.Trainer(
        max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[lightning_callback(monitor)],
    )  # fmt: skip
    trainer.fit(lightning_module(digits_cnn(channels=4, num_classes=2), lr=0.01), DataLoader(TensorDataset(x, y), 8))
    assert [r.step for r in monitor.reports] == [1, 2]  # checked from the first update on
    assert not [line for line in lines if "vanishing" in line], lines
    # the same zero gradients at step 0 would have been flagged: the quiet start is the step rule, not luck
    fresh = digits_cnn(channels=4, num_classes=2)
    monitor.attach(fresh)
    nn_loss = torch.nn.functional.cross_entropy(fresh(x[:8]), y[:8])
    nn_loss.backward()
    assert "vanishing" in monitor.check(0).kinds()
