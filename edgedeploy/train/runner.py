"""``deploy train`` end to end: config → data → model → loop → checkpoint that ``deploy build`` reads."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from edgedeploy.config import checkpoint_metadata_path
from edgedeploy.errors import CheckpointError, ConfigError, TargetCapabilityError
from edgedeploy.fileio.store import atomic_write_bytes
from edgedeploy.train import distributed as D
from edgedeploy.train import resume_checks as checks
from edgedeploy.train.amp import MixedPrecision
from edgedeploy.train.blocks import init_weights
from edgedeploy.train.checkpoint import checkpoint_metadata, code_version, load_resume_state, save_checkpoint
from edgedeploy.train.clipping import GradClipper
from edgedeploy.train.config import TrainConfig
from edgedeploy.train.data import Splits, load_splits
from edgedeploy.train.determinism import deterministic_kernels, no_deterministic_kernel
from edgedeploy.train.ema import WeightEMA
from edgedeploy.train.loop import LoopState, StepParts, StopTraining, call_model, fit
from edgedeploy.train.losses import TemperatureCrossEntropy
from edgedeploy.train.monitors import GradientFlowMonitor
from edgedeploy.train.options import (
    accepts_temperature,
    compile_model,
    fold_temperature,
    freeze,
    freeze_norm_statistics,
    no_decay_parameters,
    use_channels_last,
    write_graph,
)
from edgedeploy.train.rng import capture_rng, restore_rng
from edgedeploy.train.schedules import build_scheduler
from edgedeploy.train.selection import (
    best_path,
    epochs_without_improvement,
    ranked_epochs,
    resolve_mode,
    top_k_path,
)
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
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ConfigError(f"{cfg.source}: key 'run.freeze' froze every parameter: nothing left to train")
    groups: list[dict[str, Any]] = [{"params": trainable}]
    if cfg.optim.weight_decay and not cfg.optim.norm_bias_decay:
        exempt = {id(p) for p in no_decay_parameters(model)}
        groups = [
            {"params": [p for p in trainable if id(p) not in exempt]},
            {"params": [p for p in trainable if id(p) in exempt], "weight_decay": 0.0},
        ]
        groups = [g for g in groups if g["params"]]
    if isinstance(loss_fn, TemperatureCrossEntropy):
        groups += loss_fn.param_groups(cfg.loss.temperature_lr)
    o = cfg.optim
    if o.name == "sgd":
        return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    cls = torch.optim.AdamW if o.name == "adamw" else torch.optim.Adam
    return cls(groups, lr=o.lr, weight_decay=o.weight_decay)


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


def _input_specs(cfg: TrainConfig, splits: Splits) -> list[dict[str, Any]]:
    if splits.inputs:
        return splits.inputs
    return [
        {
            "name": cfg.deploy.input_name,
            "shape": ["batch", *splits.sample_shape],
            "dtype": "float32",
            "range": list(splits.value_range),
        }
    ]


def _metadata(
    cfg: TrainConfig, splits: Splits, kwargs: dict[str, Any], metrics: dict[str, Any], outputs: list[str] | None = None
) -> dict[str, Any]:
    from edgedeploy.modelio.usercode import factory_source

    bmin, bopt, bmax = cfg.deploy.batch
    src = factory_source(cfg)  # type: ignore[arg-type]  # duck-typed like build_model
    extra: dict[str, Any] = {
        # where the factory's module lives, for a deploy config in another folder (model.python_path)
        "python_path": [str(cfg.path(p)) for p in cfg.model.python_path],
    }
    if splits.provenance:
        extra["data"] = splits.provenance
    if cfg.run.ema:
        extra["ema"] = {"decay": cfg.run.ema, "deployed": True}
    return checkpoint_metadata(
        factory=cfg.model.factory,
        factory_kwargs=kwargs,
        inputs=_input_specs(cfg, splits),
        dims={"batch": {"min": bmin, "opt": bopt, "max": bmax}},
        outputs=outputs or list(cfg.deploy.outputs),
        normalization=splits.normalization,
        class_names=splits.class_names,
        # strict JSON: a diverged run's NaN loss is written as null (no metric), not as a bare NaN token
        metrics={k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in metrics.items()},
        code=code_version(src),
        extra=extra,
    )


def _train_state(
    state: LoopState,
    amp: MixedPrecision,
    loss_fn: nn.Module,
    scheduler: Any,
    rng: list[dict[str, Any]],
    schedule: dict[str, Any],
) -> dict[str, Any]:
    """Everything but weights and optimizer tensors that a resume needs, as JSON data: loop counters,
    scaler, learned loss parameters, the schedule's state and size (``schedule``: epochs, steps) and every
    rank's RNG state."""
    loss_state = {k: v.detach().cpu().tolist() for k, v in loss_fn.state_dict().items()}
    return {
        "loop": state.to_dict(),
        "amp": amp.state_dict(),
        "loss": loss_state,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "schedule": schedule,
        "rng": rng,
    }


def run_training(
    cfg: TrainConfig,
    out: str | Path,
    *,
    resume: bool | None = None,
    stop_after: int | None = None,
    stop_after_steps: int | None = None,
    log: Callable[[str], None] | None = None,
    callbacks: Sequence[Any] = (),
    find_lr: bool = False,
) -> TrainResult:
    """Train as configured and write ``OUT/<checkpoint.name>.safetensors`` with its metadata sidecar.

    Works single-process or under ``torchrun`` (DDP or FSDP; only rank 0 logs and writes).
    ``stop_after`` ends this invocation after that many epochs, ``stop_after_steps`` after that many
    optimizer steps (time-sliced jobs); ``resume`` continues it exactly, also mid-epoch. ``callbacks``
    are extra loop callbacks (``on_after_backward``, ``on_step_end``, ``on_epoch_end``). ``find_lr`` only
    runs the LR range test (``OUT/lr_finder.json`` and ``.png``) and returns its suggestion in
    ``metrics["suggested_lr"]``; ``optim.find_lr = true`` trains with that suggestion.

    Raises:
        ConfigError: bad factory, kwargs, loss, freeze or strategy settings; ``out`` is a file.
        InputError: unreadable training data.
        CheckpointError: ``resume`` without a usable checkpoint.
        TargetCapabilityError: device or precision not available (never downgraded silently); under
            ``run.deterministic = 'strict'``, an op with no deterministic kernel on the device.
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    out = Path(out)
    if out.exists() and not out.is_dir():  # found before an epoch runs, not when the checkpoint is written
        raise ConfigError(
            f"--out {out} is a file, not a folder", hint=f"pass the folder to train into, e.g. --out {out.parent}"
        )
    device = _device(cfg)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    amp = MixedPrecision(device, cfg.run.precision)
    r = cfg.run
    with deterministic_kernels(r.deterministic, device, cfg.source):
        fabric = D.launch(device, r.seed, r.backend, strategy=r.strategy, precision=amp.plugin, ddp=vars(r.ddp))
        try:
            resume = cfg.checkpoint.resume if resume is None else resume
            return _run(cfg, out, amp, fabric, resume, stop_after, stop_after_steps, log, callbacks, find_lr)
        finally:
            D.cleanup(fabric)


def _run(
    cfg: TrainConfig,
    out: Path,
    amp: MixedPrecision,
    fabric: Any,
    resume: bool,
    stop_after: int | None,
    stop_after_steps: int | None,
    log: Callable[[str], None],
    user_callbacks: Sequence[Any],
    find_lr: bool = False,
) -> TrainResult:
    device, distributed = fabric.device, fabric.world_size > 1
    say = log if fabric.is_global_zero else (lambda _line: None)
    fsdp = cfg.run.strategy == "fsdp" and distributed
    if fsdp and resume:
        raise ConfigError(
            f"{cfg.source}: --resume with run.strategy = 'fsdp' is not supported "
            "(its checkpoints hold gathered weights, no optimizer state)",
            hint="resume with strategy = 'ddp', or train in one call",
        )
    splits = load_splits(cfg)
    val_set = None
    if cfg.data.val_fraction:
        splits, val_set = _validation_split(cfg, splits)
    kwargs = dict(cfg.model.kwargs)
    vocab = splits.provenance.get("vocab_size")
    if vocab and isinstance(kwargs.get("vocab_size"), int) and kwargs["vocab_size"] < vocab:
        raise ConfigError(
            f"{cfg.source}: key 'model.kwargs.vocab_size' = {kwargs['vocab_size']} is smaller than the tokenizer's "
            f"{vocab} tokens",
            hint=f"set vocab_size = {vocab}",
        )
    # config problems before anything is written (a TensorBoard folder, a graph dump) or announced
    outputs = list(cfg.deploy.outputs)
    temperature_out = cfg.loss.kind == "temperature_ce" and cfg.loss.export_temperature == "output"
    if temperature_out:
        from edgedeploy.modelio.usercode import import_factory

        if not accepts_temperature(import_factory(cfg)):  # type: ignore[arg-type]
            raise ConfigError(
                f"{cfg.source}: key 'loss.export_temperature' = 'output' needs a factory with a temperature= keyword",
                hint="use export_temperature = 'fold'",
            )
        if len(outputs) == 1:
            outputs.append("probabilities")
    model = build_model(cfg).to(device)
    frozen = freeze(model, cfg.run.freeze, cfg.source) if cfg.run.freeze else []
    if frozen and cfg.run.freeze_bn_stats:
        freeze_norm_statistics(model)
    if cfg.run.sync_batchnorm and distributed:
        if device.type != "cuda":
            raise TargetCapabilityError(
                f"{cfg.source}: key 'run.sync_batchnorm' needs CUDA devices (torch's SyncBatchNorm runs on GPUs only)",
                hint="set sync_batchnorm = false on CPU (BatchNorm statistics are then copied from rank 0 each epoch)",
            )
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if cfg.run.channels_last:
        use_channels_last(model)
    loss_fn = _loss(cfg, splits, device)
    d = cfg.data
    eval_loader_of = functools.partial(DataLoader, batch_size=d.eval_batch_size, num_workers=d.num_workers)
    eval_loader = eval_loader_of(splits.test)
    val_loader = None if val_set is None else eval_loader_of(val_set)
    probe = fabric.to_device(next(iter(eval_loader))[0])  # inputs for graph dumps, compile trials, folding
    width = _check_model_fits(cfg, model, probe, splits.num_classes)
    _check_class_names(cfg, splits, width)
    if cfg.loss.kind == "temperature_ce" and cfg.loss.export_temperature == "fold" and not fsdp:
        # the fold is tried now, on a copy, so a model it cannot fold fails before training, not after the last
        # epoch (ConfigError from fold_temperature, naming the fix)
        fold_temperature(copy.deepcopy(model), 2.0, probe, call_model)
    if cfg.run.graph and fabric.is_global_zero:  # before any wrapping: a plain module, no collectives
        graph = write_graph(model, probe, out / f"{cfg.checkpoint.name}.dot", call_model)
        say(f"graph: {graph}")
    r = cfg.run
    # FSDP replaces the parameters with sharded ones: the optimizer must see those (no resume here)
    train_model = fabric.setup_module(model) if fsdp else model
    optimizer = _optimizer(cfg, model, loss_fn)
    ckpt = out / f"{cfg.checkpoint.name}.safetensors"
    state = LoopState()
    train_loader = D.make_loader(
        splits.train,
        d.batch_size,
        seed=cfg.run.seed,
        fabric=fabric,
        num_workers=d.num_workers,
        pin_memory=d.pin_memory and device.type == "cuda",
        stream_samples=splits.train_samples,
    )
    if find_lr or (cfg.optim.find_lr and not resume):
        found = _find_lr(cfg, model, optimizer, loss_fn, train_loader, fabric, out, say)
        if find_lr:
            return TrainResult(ckpt, {"suggested_lr": found}, state, fabric.world_size)
    total_steps = r.epochs * -(-len(train_loader) // r.accumulate)
    # before resuming: sized from the config's lrs
    scheduler = build_scheduler(optimizer, cfg.optim.schedule, total_steps, cfg.optim.warmup_steps)
    schedule_size = {"epochs": r.epochs, "steps": total_steps}
    # what a resume must match, recorded with the state: the optimizer, the schedule's kind, the device and
    # precision, the batching
    run_record = {
        "optimizer": type(optimizer).__name__,
        "kind": cfg.optim.schedule,
        "device": device.type,
        "precision": amp.precision,
        "batch_size": d.batch_size,
        "accumulate": r.accumulate,
    }
    if r.ema and fsdp:
        raise ConfigError(
            f"{cfg.source}: key 'run.ema' is not supported with run.strategy = 'fsdp' (sharded weights)",
            hint="use strategy = 'ddp' with EMA",
        )
    ema = WeightEMA(model, r.ema) if r.ema else None
    restore_rng_state: Callable[[], None] | None = None
    if resume:
        saved = load_resume_state(ckpt, model, optimizer)
        state = checks.loop_state(saved, ckpt)
        checks.run_fits(saved, {**schedule_size, **run_record}, state, ckpt, scheduled=scheduler is not None)
        checks.optimizer_groups(optimizer, ckpt)
        _restore_schedule(scheduler, saved, state, ckpt)
        checks.schedule_runs(scheduler, ckpt)
        if ema is not None:
            _restore_ema(ema, saved["tensors"], model, ckpt)
        ranks = saved.get("rng") or []
        checks.rng_states(ranks, ckpt)
        checks.amp_state(saved.get("amp", {}), ckpt)
        if state.batch and len(ranks) != fabric.world_size:
            raise CheckpointError(
                f"{ckpt} was saved mid-epoch by {len(ranks)} ranks; this run has {fabric.world_size}",
                hint="resume with the same number of ranks (or from an epoch-end checkpoint)",
            )
        if len(ranks) == fabric.world_size:  # mid-epoch, or at an epoch end for Python's and NumPy's generators
            restore_rng_state = functools.partial(restore_rng, ranks[fabric.global_rank], device)
        amp.load_state_dict(saved.get("amp", {}))
        if saved.get("loss"):  # learned loss parameters (e.g. the temperature) live outside the model
            checks.loss_state(loss_fn, saved["loss"], ckpt)
        # a finished run's temperature was folded into a copy for X.safetensors: the training weights the resume
        # file holds were never divided by T, so nothing is undone here
        where = f", batch {state.batch} of epoch {state.epoch + 1}" if state.batch else ""
        say(f"resumed from {ckpt} at epoch {state.epoch}, step {state.step}{where}")
        if state.stopped_early:  # a finished run: resuming it trains nothing and rewrites nothing
            say(f"the run stopped early at epoch {state.epoch}: nothing left to train")
            metrics = dict(state.history[-1]) if state.history else {}
            return TrainResult(ckpt, metrics, state, fabric.world_size)
    if distributed and not fsdp:  # DDP after resuming: it broadcasts rank 0's (resumed) weights
        train_model = fabric.setup_module(model)
    held = D.local_param_numel(model)  # under FSDP: this rank's shard only
    compiled = False
    if r.compile:

        def trial(m: nn.Module) -> None:
            m.eval()
            try:
                with torch.no_grad(), amp.autocast():
                    call_model(m, probe)
            finally:
                m.train()

        train_model, compiled = compile_model(train_model, r.compile_backend, trial, say)
    clipper = GradClipper(cfg.clip.mode, max_norm=cfg.clip.max_norm, clip_value=cfg.clip.clip_value)
    callbacks: list[Any] = list(user_callbacks)
    if cfg.monitor.gradients:
        callbacks.append(GradientFlowMonitor(cfg.monitor.vanishing, cfg.monitor.exploding, cfg.monitor.every, say))
        callbacks[-1].attach(model)
    tb = None
    if cfg.monitor.tensorboard and fabric.is_global_zero:
        from edgedeploy.train.tensorboard import TensorBoardLogger

        tb = TensorBoardLogger(out / "tensorboard", cfg.monitor.every, cfg.monitor.histograms)
        callbacks.append(tb)
    say(
        f"deploy train: {cfg.model.factory} on {device} ({amp.precision}), world_size {fabric.world_size}"
        f"{' (' + r.strategy + ')' if distributed else ''}, "
        f"{_count(splits.train, splits.train_samples)} train / {_count(splits.test, None)} test samples, "
        f"batch {d.batch_size} x {r.accumulate} accumulated x {fabric.world_size} ranks, "
        f"epochs {state.epoch + 1}..{r.epochs}"
        + (f", {len(frozen)} frozen tensors" if frozen else "")
        + (", compiled" if compiled else "")
    )

    def deploy_weights() -> dict[str, torch.Tensor] | None:
        """What X.safetensors holds: the EMA weights when on, else the model's (gathered under FSDP)."""
        if ema is not None:
            return {k: v.detach().cpu() for k, v in ema.module.state_dict().items()}
        return D.full_state_dict(model) if fsdp else None  # a collective: every rank

    def write(state: LoopState, metrics: dict[str, Any]) -> None:
        """An intermediate checkpoint (collectives on every rank, files on rank 0)."""
        weights = deploy_weights()
        rng = D.gather_objects(capture_rng(device), fabric)
        if fabric.is_global_zero:
            meta = _metadata(cfg, splits, kwargs, {**metrics, "world_size": fabric.world_size})
            save_resumable(
                meta, _train_state(state, amp, loss_fn, scheduler, rng, {**schedule_size, **run_record}), weights
            )
        fabric.barrier()

    def save_resumable(meta: dict[str, Any], train_state: dict[str, Any], weights: dict[str, Any] | None) -> None:
        """The checkpoint with its resumable state (under FSDP: gathered weights, no optimizer state)."""
        optim = None if fsdp else optimizer
        ema_tensors = _ema_tensors(ema)
        save_checkpoint(
            ckpt, model, meta, optimizer=optim, train_state=train_state, weights=weights, state_tensors=ema_tensors
        )

    c = cfg.checkpoint
    mode = resolve_mode(c.monitor, c.mode)

    def select(state: LoopState, metrics: dict[str, float]) -> None:
        """Best / top-k deployable checkpoints (weights + sidecar, no resume state) by ``c.monitor``."""
        if not (c.save_best or c.top_k) or c.monitor not in metrics:
            return
        weights = deploy_weights()  # a collective under FSDP: every rank
        if not fabric.is_global_zero:
            return
        ranked = ranked_epochs(state.history, c.monitor, mode)
        if not (c.save_best and ranked and ranked[0] == state.epoch) and state.epoch not in ranked[: c.top_k]:
            ranked_out(ranked)
            return
        # deployed as the final checkpoint is: the temperature folded in (or a kwarg), the samples listed
        weights, save_kwargs, temperature, _ = deployable(weights)
        outs = outputs if temperature_out else list(cfg.deploy.outputs)
        meta = _metadata(cfg, splits, save_kwargs, {**metrics, "world_size": fabric.world_size}, outs)
        if temperature is not None:
            meta["temperature"] = temperature
        written, hashes = deploy_data()
        if written:
            meta.update(trainer="deploy train", deploy_data=written, deploy_data_sha256=hashes)
        meta["selection"] = {"monitor": c.monitor, "mode": mode, "epoch": state.epoch, "value": metrics[c.monitor]}
        if c.save_best and ranked and ranked[0] == state.epoch:
            save_checkpoint(best_path(ckpt), model, meta, weights=weights)
            say(f"best {c.monitor} {metrics[c.monitor]:.4f} at epoch {state.epoch}: {best_path(ckpt).name}")
        if c.top_k:
            if state.epoch in ranked[: c.top_k]:
                save_checkpoint(top_k_path(ckpt, state.epoch), model, meta, weights=weights)
        ranked_out(ranked)

    def ranked_out(ranked: list[int]) -> None:
        """Remove the top-k files of the epochs no longer among the best ``c.top_k``."""
        for old in ranked[c.top_k :] if c.top_k else []:
            for path in (top_k_path(ckpt, old), checkpoint_metadata_path(top_k_path(ckpt, old))):
                path.unlink(missing_ok=True)

    written_data: list[tuple[dict[str, str], dict[str, str]]] = []

    def deploy_data() -> tuple[dict[str, str], dict[str, str]]:
        """The deploy samples every sidecar lists (written once, on rank 0). Reading them runs the dataset's
        ``__getitem__``, whose augmentation draws from the global generators: their states are put back, so a
        best checkpoint written mid-run leaves the training draws (and an exact resume) as they were."""
        if not written_data:
            generators = capture_rng(device)
            try:
                written_data.append(_write_deploy_data(cfg, splits, out))
            finally:
                restore_rng(generators, device)
        return written_data[0]

    def deployable(
        weights: dict[str, torch.Tensor] | None, finished: bool = True
    ) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any], dict[str, Any] | None, str | None]:
        """(weights, factory kwargs, the sidecar's temperature entry, the layer a temperature was folded into)
        of a deployable checkpoint of the model as it is now: a learned temperature folded into the last Linear
        layer (only into a ``finished`` run's), or passed as the factory's ``temperature`` keyword, as
        ``loss.export_temperature`` asks. The entry says what the weights hold, not what the config asks."""
        T = getattr(loss_fn, "temperature", None)
        if not isinstance(T, float):
            return weights, dict(kwargs), None, None
        if cfg.loss.export_temperature == "fold" and not fsdp and finished:
            folded_model = copy.deepcopy(ema.module if ema is not None else model)
            layer = fold_temperature(folded_model, T, probe, call_model)
            return D.full_state_dict(folded_model), dict(kwargs), {"value": T, "export": "fold"}, layer
        if temperature_out:
            return weights, {**kwargs, "temperature": T}, {"value": T, "export": "output"}, None
        export: str = cfg.loss.export_temperature
        if export == "fold":
            export = "not folded: the run is unfinished" if not finished else "not folded (fsdp)"
        return weights, dict(kwargs), {"value": T, "export": export}, None

    def save(state: LoopState, metrics: dict[str, float]) -> None:
        select(state, metrics)
        if cfg.monitor.csv and fabric.is_global_zero:
            write_metrics_csv(out / f"{cfg.checkpoint.name}.metrics.csv", state.history)
        last = state.epoch == cfg.run.epochs  # the final checkpoint is written after the loop
        stop = bool(r.early_stop_patience) and (
            epochs_without_improvement(state.history, c.monitor, mode, r.early_stop_min_delta) >= r.early_stop_patience
        )
        if not last and not stop and state.epoch % cfg.checkpoint.every_epochs == 0:
            write(state, metrics)
        if stop and not last:
            say(f"early stop: {c.monitor} did not improve for {r.early_stop_patience} epochs")
            state.stopped_early = True  # a finished run: the final checkpoint is its last one
            raise StopTraining

    first_step = state.step
    epoch_batches = len(train_loader)  # before any mid-epoch skip shortens it

    def on_step(state: LoopState) -> None:
        every = cfg.checkpoint.every_steps
        if every and state.step % every == 0 and state.batch < epoch_batches:  # epoch ends save by epoch
            write(state, {"epoch": state.epoch, "step": state.step})
        if stop_after_steps is not None and state.step - first_step >= stop_after_steps:
            raise StopTraining

    t0 = time.perf_counter()
    profiler = step_profiler(out / "profile") if cfg.monitor.profile and fabric.is_global_zero else None
    memory = PeakMemory(device) if cfg.monitor.memory else contextlib.nullcontext()
    try:
        with memory, anomaly_detection(cfg.monitor.anomaly_detection), profiler or contextlib.nullcontext():
            parts = StepParts(
                train_model,
                optimizer,
                loss_fn,
                amp,
                fabric,
                clipper=clipper,
                scheduler=scheduler,
                callbacks=callbacks,
                profiler=profiler,
                accumulate=r.accumulate,
                ema=ema,
                on_step=on_step,
            )
            state = fit(
                parts,
                train_loader,
                epochs=r.epochs,
                stop_after=stop_after,
                seed=r.seed,
                eval_loader=eval_loader,
                val_loader=val_loader,
                state=state,
                on_epoch_end=save,
                log=say,
                rng_state=restore_rng_state,
            )
    finally:
        if tb is not None:
            tb.close()
    del train_model  # DDP's reducer goes before the process group does
    weights = deploy_weights() or D.full_state_dict(model)
    digests = D.gather_objects(D.param_digest(model, weights), fabric)
    rng = D.gather_objects(capture_rng(device), fabric)
    if state.batch:  # stopped mid-epoch: the last epoch's figures are not these weights'; say where they are
        metrics = {"epoch": state.epoch, "step": state.step, "batch": state.batch}
    else:
        metrics = dict(state.history[-1]) if state.history else {}
    metrics.update(world_size=fabric.world_size, seconds=round(time.perf_counter() - t0, 3), compiled=compiled)
    if isinstance(memory, PeakMemory):
        metrics["peak_memory_mib"] = round(memory.peak_bytes / 2**20, 1)
        say(memory.summary())
    if fabric.is_global_zero and state.step:
        train_state = _train_state(state, amp, loss_fn, scheduler, rng, {**schedule_size, **run_record})
        finished = state.epoch == r.epochs or state.stopped_early
        folded_weights, save_kwargs, t_entry, folded_into = deployable(weights, finished)
        weights = folded_weights if folded_weights is not None else weights
        if t_entry is not None and folded_into is not None:
            train_state["folded_temperature"] = {"layer": folded_into, "temperature": t_entry["value"]}
            T = t_entry["value"]
            say(f"temperature {T:.4f} folded into {folded_into!r}: the checkpoint's logits are logits / T")
        # final metadata: adds run totals and every rank's weight digest (proof the replicas agree)
        meta = _metadata(cfg, splits, save_kwargs, metrics, outputs if temperature_out else list(cfg.deploy.outputs))
        meta["distributed"] = {
            "world_size": fabric.world_size,
            "strategy": r.strategy,
            "replica_digests": digests,
            "param_numel": sum(v.numel() for k, v in weights.items() if k in dict(model.named_parameters())),
            "rank0_param_numel_held": held,
        }
        if t_entry is not None:  # what this checkpoint's weights hold, not what the config asks of a finished run
            meta["temperature"] = t_entry
        if frozen:
            meta["frozen"] = frozen
        # the samples first: the sidecar lists them with their sha256, the contract export_for_deploy keeps for
        # every trainer, so `deploy build --checkpoint OUT --precision int8` calibrates and judges on them
        written, hashes = deploy_data()
        if written:
            meta.update(trainer="deploy train", deploy_data=written, deploy_data_sha256=hashes)
        save_resumable(meta, train_state, weights)
        say(f"checkpoint: {ckpt} (metadata {ckpt.with_suffix('.meta.json').name})")
    fabric.barrier()
    if len(set(digests)) > 1:
        say(f"warning: ranks ended with different weights: {digests}")
    return TrainResult(ckpt, metrics, state, fabric.world_size, digests)


def _find_lr(
    cfg: TrainConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
    loader: Any,
    fabric: Any,
    out: Path,
    say: Callable[[str], None],
) -> float:
    """Run the LR range test (model and optimizer restored afterwards), write ``OUT/lr_finder.json`` (and
    ``.png`` with matplotlib), set every group's lr to the suggestion (groups keep their ratios) and
    return it. Under DDP rank 0's suggestion is used by every rank.

    Raises:
        ConfigError: the test saw no finite loss.
    """
    import json

    from edgedeploy.train.lr_finder import lr_range_test

    batches = (fabric.to_device(batch) for batch in _cycle(loader))
    result = lr_range_test(model, batches, optimizer, loss_fn, num_iter=cfg.optim.find_lr_iters)
    suggested = float(fabric.broadcast(result.suggested_lr, src=0))
    top = max(float(g["lr"]) for g in optimizer.param_groups)
    for group in optimizer.param_groups:
        group["lr"] = float(group["lr"]) / top * suggested
        group["initial_lr"] = group["lr"]
    if fabric.is_global_zero:
        out.mkdir(parents=True, exist_ok=True)
        doc = {"suggested_lr": suggested, "lrs": result.lrs, "losses": result.losses}
        (out / "lr_finder.json").write_text(json.dumps(doc, indent=1))
        plot = ""
        try:
            plot = f", plot {result.plot(out / 'lr_finder.png')}"
        except ImportError:
            plot = " (pip install 'edgedeploy[report]' for the plot)"
        say(f"lr finder: suggested lr {suggested:.3e} ({len(result.lrs)} steps){plot}")
    return suggested


def _cycle(loader: Any) -> Any:
    """The loader's batches, epoch after epoch (the range test stops drawing when it is done)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            return


def write_metrics_csv(path: Path, history: Sequence[dict[str, Any]]) -> Path:
    """One row per epoch (every metric the history holds), rewritten whole: a resumed run's file equals
    an uninterrupted one's."""
    import csv
    import io

    columns: list[str] = []
    for row in history:
        columns += [k for k in row if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(history)
    atomic_write_bytes(path, buf.getvalue().encode())
    return path


def _validation_split(cfg: TrainConfig, splits: Splits) -> tuple[Splits, Any]:
    """Hold ``data.val_fraction`` of the train split out for model selection (seeded by ``data.split_seed``).

    Raises:
        ConfigError: the train split is a stream (no random access to split).
    """
    train = splits.train
    if not hasattr(train, "__len__") or not hasattr(train, "__getitem__"):
        raise ConfigError(
            f"{cfg.source}: key 'data.val_fraction' needs a map-style train set, not a stream ({cfg.data.dataset})",
            hint="hold out validation shards yourself, or set val_fraction = 0",
        )
    n = len(train)
    n_val = max(1, round(n * cfg.data.val_fraction))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.data.split_seed + 7919)).tolist()
    val = torch.utils.data.Subset(train, order[:n_val])
    rest = torch.utils.data.Subset(train, sorted(order[n_val:]))
    return dataclasses.replace(splits, train=rest), val


def _restore_schedule(scheduler: Any, saved: dict[str, Any], state: LoopState, ckpt: Path) -> None:
    """Load the saved schedule state (the optimizer's rates were loaded with its state).

    A checkpoint from before schedule states were saved is replayed from the config's rates.

    Raises:
        CheckpointError: the saved schedule is not this config's schedule.
    """
    if scheduler is None:
        return
    if saved.get("scheduler"):
        try:
            scheduler.load_state_dict(saved["scheduler"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(
                f"{ckpt}: its saved LR schedule does not fit optim.schedule ({exc})",
                hint="resume with the schedule the run started with",
            ) from None
        return
    for group in scheduler.optimizer.param_groups:  # loaded state holds lowered rates: start from the config's
        group["lr"] = group["initial_lr"]
    scheduler.last_epoch = 0
    with warnings.catch_warnings():  # replaying without optimizer steps is intended here
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(state.optimizer_steps):
            scheduler.step()


def _ema_tensors(ema: WeightEMA | None) -> dict[str, torch.Tensor]:
    return {} if ema is None else {f"ema.{k}": v for k, v in ema.state_dict().items()}


def _restore_ema(ema: WeightEMA, tensors: dict[str, torch.Tensor], model: nn.Module, ckpt: Path) -> None:
    """Load the saved EMA weights; a checkpoint without them starts the average from the resumed weights.

    Raises:
        CheckpointError: the saved EMA does not fit the model.
    """
    state = {k[len("ema.") :]: v for k, v in tensors.items() if k.startswith("ema.")}
    if not state:
        ema.update(model)
        return
    try:
        ema.load_state_dict(state)
    except (RuntimeError, KeyError) as exc:
        raise CheckpointError(f"{ckpt}: its EMA weights do not fit the model ({str(exc).splitlines()[0]})") from None


def _check_model_fits(cfg: TrainConfig, model: nn.Module, probe: Any, num_classes: int) -> int:
    """One eval-mode forward on two held-out samples: a model that does not fit the data fails here in
    one line (naming the shapes), not as a traceback in the first training step. Returns the model's number of
    outputs (classes).

    Raises:
        ConfigError: the forward fails, or the model has fewer outputs than the data has classes.
        TargetCapabilityError: ``run.deterministic = 'strict'`` and the forward runs an op with no deterministic
            kernel.
    """
    few = probe[:2] if isinstance(probe, torch.Tensor) else type(probe)(t[:2] for t in probe)
    shapes = [tuple(t.shape) for t in (few if isinstance(few, (tuple, list)) else [few])]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = call_model(model, few)
    except (RuntimeError, IndexError, TypeError, ValueError) as exc:
        refused = no_deterministic_kernel(exc, (few if isinstance(few, torch.Tensor) else few[0]).device, cfg.source)
        if refused is not None:  # the data fits; strict determinism refused an op of the forward
            raise refused from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{cfg.source}: model {cfg.model.factory} with kwargs {dict(cfg.model.kwargs)} does not fit the data "
            f"(inputs {shapes}): {first}",
            hint="match model.kwargs (input size, vocab_size, max_length, num_classes) to the data",
        ) from None
    finally:
        model.train(was_training)
    logits = out[0] if isinstance(out, (tuple, list)) else out
    if logits.ndim != 2 or logits.shape[-1] < num_classes:
        raise ConfigError(
            f"{cfg.source}: model {cfg.model.factory} returns shape {tuple(logits.shape)} "
            f"for {num_classes} classes in the data",
            hint="set num_classes in model.kwargs to the number of classes",
        )
    return int(logits.shape[-1])


def _check_class_names(cfg: TrainConfig, splits: Splits, width: int) -> None:
    """The sidecar names one class per model output: names counted from the data's labels (which may miss a class
    the model has) are completed to the model's outputs; names given (``deploy.class_names``, a data callable's
    ``class_names``) must number exactly that.

    Raises:
        ConfigError: given names of another count than the model's outputs.
    """
    names = splits.class_names
    if len(names) == width:
        return
    if names != [str(i) for i in range(len(names))]:
        raise ConfigError(
            f"{cfg.source}: {len(names)} class names ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}) for "
            f"a model with {width} outputs",
            hint="list one name per output in deploy.class_names (or match model.kwargs.num_classes to them)",
        )
    splits.class_names = [str(i) for i in range(width)]


def _write_deploy_data(cfg: TrainConfig, splits: Splits, out: Path) -> tuple[dict[str, str], dict[str, str]]:
    """``<name>.calib.npz`` (training inputs, for precision.calib) and ``<name>.validate.npz`` (held-out
    inputs, never trained or calibrated on, for validate.data), keyed by input name, in the deployed dims.
    Returns the file names written and their sha256, by role (``calib``, ``validate``), for the sidecar."""
    import numpy as np

    from edgedeploy.fileio.hashing import sha256_file

    names = [spec["name"] for spec in _input_specs(cfg, splits)]
    most = cfg.deploy.batch[2]
    calib = splits.calibration or _inputs_of(splits.train, names, 128, plain=True)
    held = splits.validation or _inputs_of(splits.test, names, most)
    written: dict[str, str] = {}
    hashes: dict[str, str] = {}
    out.mkdir(parents=True, exist_ok=True)
    for role, arrays in (("calib", calib), ("validate", {k: v[:most] for k, v in held.items()})):
        if arrays:
            name = f"{cfg.checkpoint.name}.{role}.npz"
            np.savez(out / name, **arrays)  # type: ignore[arg-type]
            written[role] = name
            hashes[role] = sha256_file(out / name)
    return written, hashes


def _inputs_of(dataset: Any, names: list[str], limit: int, plain: bool = False) -> dict[str, Any]:
    """The first ``limit`` inputs of a dataset as arrays by input name (augmentation off when ``plain``),
    collected as :func:`edgedeploy.train.export.collect_inputs` does for every trainer."""
    from edgedeploy.train.export import collect_inputs

    if plain:
        dataset = _without_transform(dataset)
    try:
        return collect_inputs(dataset, names, limit, by_name=False)
    except ConfigError:
        return {}  # inputs the sidecar does not describe one-to-one: leave it to the user


def _without_transform(dataset: Any) -> Any:
    """A shallow copy of ``dataset`` (or of the set a ``Subset`` draws from) with its augmentation off."""
    if isinstance(dataset, torch.utils.data.Subset):
        return torch.utils.data.Subset(_without_transform(dataset.dataset), dataset.indices)
    if getattr(dataset, "transform", None) is not None:
        dataset = copy.copy(dataset)
        dataset.transform = None
    return dataset


def _count(dataset: Any, fallback: int | None) -> str:
    try:
        return str(len(dataset))
    except TypeError:
        return str(fallback) if fallback else "streamed"
