"""``deploy train`` end to end: config → data → model → loop → checkpoint that ``deploy build`` reads."""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgedeploy.errors import ConfigError, TargetCapabilityError
from edgedeploy.train import distributed as D
from edgedeploy.train.amp import MixedPrecision
from edgedeploy.train.blocks import init_weights
from edgedeploy.train.checkpoint import checkpoint_metadata, code_version, load_resume_state, save_checkpoint
from edgedeploy.train.clipping import GradClipper
from edgedeploy.train.config import TrainConfig
from edgedeploy.train.data import Splits, load_splits
from edgedeploy.train.loop import LoopState, fit
from edgedeploy.train.losses import TemperatureCrossEntropy
from edgedeploy.train.monitors import GradientFlowMonitor
from edgedeploy.train.utils import PeakMemory, anomaly_detection, step_profiler


@dataclass
class TrainResult:
    """Where the checkpoint went and the final metrics (``history`` has one entry per epoch)."""

    checkpoint: Path
    metrics: dict[str, Any]
    state: LoopState
    world_size: int = 1
    replica_digests: list[str] = field(default_factory=list)


def _device(cfg: TrainConfig) -> torch.device:
    if cfg.run.device == "cuda" and not torch.cuda.is_available():
        raise TargetCapabilityError(
            f"{cfg.source}: run.device = 'cuda' but no CUDA device is visible", hint="use device = 'auto' or 'cpu'"
        )
    if cfg.run.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.run.device)


def build_model(cfg: TrainConfig) -> nn.Module:
    """Instantiate the configured factory with deploy.toml's import rules, then apply ``model.init``.

    Raises:
        ConfigError: the factory does not import, raises, or returns something other than a module.
    """
    from edgedeploy.modelio.checkpoint import build_model as build_from_factory

    model = build_from_factory(cfg)  # type: ignore[arg-type]  # duck-typed: model.factory/kwargs/python_path, path()
    return init_weights(model) if cfg.model.init == "policy" else model


def _optimizer(cfg: TrainConfig, model: nn.Module, loss_fn: nn.Module) -> torch.optim.Optimizer:
    groups: list[dict[str, Any]] = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    if isinstance(loss_fn, TemperatureCrossEntropy):
        groups += loss_fn.param_groups(cfg.loss.temperature_lr)
    o = cfg.optim
    if o.name == "sgd":
        return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    cls = torch.optim.AdamW if o.name == "adamw" else torch.optim.Adam
    return cls(groups, lr=o.lr, weight_decay=o.weight_decay)


def _scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int) -> Any:
    total = max(1, cfg.run.epochs * steps_per_epoch)
    if cfg.optim.schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    if cfg.optim.schedule == "onecycle":
        max_lr = [g["lr"] for g in optimizer.param_groups]
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=max_lr, total_steps=total)
    return None


def _loss(cfg: TrainConfig, splits: Splits, device: torch.device) -> nn.Module:
    weights = list(cfg.loss.class_weights) or None
    if weights is not None and len(weights) != splits.num_classes:
        raise ConfigError(
            f"{cfg.source}: key 'loss.class_weights' has {len(weights)} entries for {splits.num_classes} classes"
        )
    if cfg.loss.kind == "temperature_ce":
        return TemperatureCrossEntropy(
            cfg.loss.temperature, weights, cfg.loss.learn_temperature, cfg.loss.label_smoothing
        ).to(device)
    w = None if weights is None else torch.tensor(weights, device=device)
    return nn.CrossEntropyLoss(weight=w, label_smoothing=cfg.loss.label_smoothing)


def _metadata(cfg: TrainConfig, splits: Splits, kwargs: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    from edgedeploy.modelio.usercode import factory_source

    bmin, bopt, bmax = cfg.deploy.batch
    src = factory_source(cfg)  # type: ignore[arg-type]  # duck-typed like build_model
    return checkpoint_metadata(
        factory=cfg.model.factory,
        factory_kwargs=kwargs,
        inputs=[
            {
                "name": cfg.deploy.input_name,
                "shape": ["batch", *splits.sample_shape],
                "dtype": "float32",
                "range": list(splits.value_range),
            }
        ],
        dims={"batch": {"min": bmin, "opt": bopt, "max": bmax}},
        outputs=list(cfg.deploy.outputs),
        normalization=splits.normalization,
        class_names=splits.class_names,
        metrics=metrics,
        code=code_version(src),
    )


def _train_state(state: LoopState, amp: MixedPrecision, loss_fn: nn.Module) -> dict[str, Any]:
    """Everything but weights and optimizer tensors that a resume needs, as JSON data."""
    loss_state = {k: v.detach().cpu().tolist() for k, v in loss_fn.state_dict().items()}
    return {"loop": state.to_dict(), "amp": amp.state_dict(), "loss": loss_state}


def run_training(
    cfg: TrainConfig,
    out: str | Path,
    *,
    resume: bool | None = None,
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train as configured and write ``OUT/<checkpoint.name>.safetensors`` with its metadata sidecar.

    Works single-process or under ``torchrun`` (DDP; only rank 0 logs and writes). ``stop_after``
    ends this invocation after that many epochs (time-sliced jobs); ``resume`` continues it exactly.

    Raises:
        ConfigError: bad factory, kwargs or loss settings.
        InputError: unreadable training data.
        CheckpointError: ``resume`` without a usable checkpoint.
        TargetCapabilityError: device or precision not available (never downgraded silently).
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    out = Path(out)
    device = _device(cfg)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    info = D.setup(device, cfg.run.seed, cfg.run.backend)
    try:
        resume = cfg.checkpoint.resume if resume is None else resume
        return _run(cfg, out, device, info, resume, stop_after, log)
    finally:
        D.cleanup()


def _run(
    cfg: TrainConfig,
    out: Path,
    device: torch.device,
    info: D.DistInfo,
    resume: bool,
    stop_after: int | None,
    log: Callable[[str], None],
) -> TrainResult:
    say = log if info.is_main else (lambda _line: None)
    splits = load_splits(cfg)
    kwargs = dict(cfg.model.kwargs)
    model = build_model(cfg).to(device)
    loss_fn = _loss(cfg, splits, device)
    optimizer = _optimizer(cfg, model, loss_fn)
    amp = MixedPrecision(device, cfg.run.precision)
    ckpt = out / f"{cfg.checkpoint.name}.safetensors"
    state = LoopState()
    train_loader = D.make_loader(splits.train, cfg.data.batch_size, shuffle=True, seed=cfg.run.seed, info=info)
    eval_loader = torch.utils.data.DataLoader(splits.test, batch_size=cfg.data.eval_batch_size)
    scheduler = _scheduler(cfg, optimizer, len(train_loader))  # before resuming: sized from the config's lrs
    if resume:
        saved = load_resume_state(ckpt, model, optimizer)
        state = LoopState.from_dict(saved.get("loop", {}))
        amp.load_state_dict(saved.get("amp", {}))
        if saved.get("loss"):  # learned loss parameters (e.g. the temperature) live outside the model
            loss_fn.load_state_dict({k: torch.tensor(v) for k, v in saved["loss"].items()})
        say(f"resumed from {ckpt} at epoch {state.epoch}, step {state.step}")
    if scheduler is not None and state.step:
        with warnings.catch_warnings():  # replaying without optimizer steps is intended here
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(state.step):  # these schedules are pure functions of the step count
                scheduler.step()
    ddp_model = D.wrap_model(model, info, device)
    clipper = GradClipper(cfg.clip.mode, max_norm=cfg.clip.max_norm, clip_value=cfg.clip.clip_value)
    callbacks: list[Any] = []
    if cfg.monitor.gradients:
        callbacks.append(GradientFlowMonitor(cfg.monitor.vanishing, cfg.monitor.exploding, cfg.monitor.every, say))
        callbacks[-1].attach(model)
    say(
        f"deploy train: {cfg.model.factory} on {device} ({amp.precision}), world_size {info.world_size}, "
        f"{len(splits.train)} train / {len(splits.test)} test samples, epochs {state.epoch + 1}..{cfg.run.epochs}"
    )

    def save(state: LoopState, metrics: dict[str, float]) -> None:
        last = state.epoch == cfg.run.epochs  # the final checkpoint is written after the loop
        if info.is_main and not last and state.epoch % cfg.checkpoint.every_epochs == 0:
            meta = _metadata(cfg, splits, kwargs, {**metrics, "world_size": info.world_size})
            train_state = _train_state(state, amp, loss_fn)
            save_checkpoint(ckpt, model, meta, optimizer=optimizer, train_state=train_state)
        D.barrier(info)

    t0 = time.perf_counter()
    profiler = step_profiler(out / "profile") if cfg.monitor.profile and info.is_main else None
    memory = PeakMemory(device) if cfg.monitor.memory else contextlib.nullcontext()
    with memory, anomaly_detection(cfg.monitor.anomaly_detection), profiler or contextlib.nullcontext():
        state = fit(
            ddp_model,
            train_loader,
            optimizer=optimizer,
            loss_fn=loss_fn,
            amp=amp,
            device=device,
            epochs=cfg.run.epochs,
            stop_after=stop_after,
            seed=cfg.run.seed,
            info=info,
            eval_loader=eval_loader,
            state=state,
            clipper=clipper,
            scheduler=scheduler,
            callbacks=callbacks,
            on_epoch_end=save,
            log=say,
            profiler=profiler,
        )
    digests = D.gather_digests(model, info)
    metrics = dict(state.history[-1]) if state.history else {}
    metrics.update(world_size=info.world_size, seconds=round(time.perf_counter() - t0, 3))
    if isinstance(memory, PeakMemory):
        metrics["peak_memory_mib"] = round(memory.peak_bytes / 2**20, 1)
        say(memory.summary())
    if info.is_main and state.history:
        # final metadata: adds run totals and every rank's weight digest (proof the replicas agree)
        meta = _metadata(cfg, splits, kwargs, metrics)
        meta["distributed"] = {"world_size": info.world_size, "replica_digests": digests}
        train_state = _train_state(state, amp, loss_fn)
        save_checkpoint(ckpt, model, meta, optimizer=optimizer, train_state=train_state)
        say(f"checkpoint: {ckpt} (metadata {ckpt.with_suffix('.meta.json').name})")
    D.barrier(info)
    if len(set(digests)) > 1:
        say(f"warning: ranks ended with different weights: {digests}")
    return TrainResult(ckpt, metrics, state, info.world_size, digests)
