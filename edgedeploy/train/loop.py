"""The training loop: mixed precision, safe steps, clipping, callbacks, evaluation, throughput."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from edgedeploy.train.amp import MixedPrecision
from edgedeploy.train.clipping import GradClipper
from edgedeploy.train.distributed import set_epoch, unwrap


@dataclass
class LoopState:
    """Progress of a run; JSON data, saved with the checkpoint so a run can resume."""

    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps attempted (one per ``accumulate`` batches)
    history: list[dict[str, float]] = field(default_factory=list)
    optimizer_steps: int = 0  # steps actually taken (attempted minus skipped): what a schedule counts
    batch: int = 0  # batches of epoch ``epoch + 1`` already trained on (0: at an epoch boundary)
    partial: dict[str, float] = field(default_factory=dict)  # that epoch's running loss sum, samples, skips
    stopped_early: bool = False  # early stopping ended the run: it is finished, whatever ``epoch`` says

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoopState:
        step = int(data.get("step", 0))
        return cls(
            int(data.get("epoch", 0)),
            step,
            list(data.get("history", [])),
            int(data.get("optimizer_steps", step)),
            int(data.get("batch", 0)),
            {k: float(v) for k, v in dict(data.get("partial", {})).items()},
            bool(data.get("stopped_early", False)),
        )


class StopTraining(Exception):
    """Raised by a step hook to end training after the current optimizer step (state stays consistent)."""


def call_model(model: nn.Module, x: Any) -> torch.Tensor:
    """``model(x)``; a tuple/list batch input is passed as positional inputs, a dict as keywords."""
    if isinstance(x, dict):
        return model(**x)
    if isinstance(x, (tuple, list)):
        return model(*x)
    return model(x)


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable[Any], fabric: Any, amp: MixedPrecision) -> dict[str, float]:
    """Top-1 accuracy and mean cross-entropy over ``loader`` (model in eval mode, restored afterwards)."""
    was_training = model.training
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    try:
        for batch in loader:
            x, y = fabric.to_device(batch)
            with amp.autocast():
                logits = call_model(model, x)
            loss_sum += float(nn.functional.cross_entropy(logits.float(), y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
            total += int(y.numel())
    finally:
        model.train(was_training)
    return {"accuracy": correct / max(total, 1), "loss": loss_sum / max(total, 1)}


@dataclass
class StepParts:
    """What each optimizer step of :func:`fit` uses: the model (Fabric's wrapper under DDP / FSDP), its
    optimizer and loss, precision, the Fabric running them, and the optional clipper, LR schedule, loop
    callbacks (``on_after_backward``, ``on_step_end``, ``on_epoch_end``), profiler, gradient accumulation,
    EMA and ``on_step`` hook."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    amp: MixedPrecision
    fabric: Any
    clipper: GradClipper | None = None
    scheduler: Any = None
    callbacks: Sequence[Any] = ()
    profiler: Any = None
    accumulate: int = 1
    ema: Any = None
    on_step: Callable[[LoopState], None] | None = None


def train_epoch(
    parts: StepParts, loader: Iterable[Any], state: LoopState, start: Callable[[], None] | None = None
) -> dict[str, float]:
    """One pass over ``loader`` (or its rest, after a mid-epoch resume). Returns this rank's summed loss,
    sample count and skipped steps for the whole epoch (``state.partial`` carries them across a resume).

    ``ema.update(model)`` runs after every optimizer step taken; ``on_step(state)`` after every optimizer
    step (``state.batch`` counts the epoch's batches done: a step checkpoint saved there resumes at the
    next batch); ``start()`` runs once the loader's iterator exists (restoring a mid-epoch RNG state
    there keeps the iterator's own seed draw out of it).

    With ``accumulate = N`` the gradients of N batches are summed before one optimizer step; each
    batch's loss is divided by N, so N batches of B give the gradient of one batch of N*B (exactly,
    for a mean loss and no batch statistics). A shorter last group is rescaled to its own size. Under
    DDP and FSDP the gradient sync runs only on the last batch of a group (Fabric's ``no_backward_sync``).
    """
    model, optimizer, fabric, accumulate = parts.model, parts.optimizer, parts.fabric, parts.accumulate
    model.train()
    part = state.partial or {}
    loss_sum, samples, skipped = part.get("loss_sum", 0.0), int(part.get("samples", 0)), int(part.get("skipped", 0))
    total = len(loader) if hasattr(loader, "__len__") else None  # type: ignore[arg-type]
    group = 0  # batches accumulated so far in this group
    consumed = 0  # batches of this call counted into state.batch
    synced = fabric.world_size > 1  # DDP / FSDP reduce gradients in backward: Fabric's no_backward_sync holds it
    batches = iter(loader)
    if start is not None:
        start()
    for i, batch in enumerate(batches):
        x, y = fabric.to_device(batch)
        if group == 0:
            optimizer.zero_grad(set_to_none=True)
        group += 1
        last = group == accumulate or (total is not None and i == total - 1)
        with fabric.no_backward_sync(model, enabled=not last) if synced else contextlib.nullcontext():
            with parts.amp.autocast():
                loss = parts.loss_fn(call_model(model, x), y)
            fabric.backward(loss / accumulate if accumulate > 1 else loss)  # scaled by the precision plugin
        loss_sum += float(loss.detach()) * len(y)
        samples += len(y)
        if not last:
            continue
        if group < accumulate:  # short final group: the mean over its own batches
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(accumulate / group)
        group = 0
        _call(parts.callbacks, "on_after_backward", state.step, unwrap(model), grad_scale=parts.amp.scale)
        lr = float(optimizer.param_groups[0]["lr"])
        stepped = parts.amp.step(optimizer, clip=parts.clipper)
        if stepped:
            state.optimizer_steps += 1
            if parts.scheduler is not None:
                parts.scheduler.step()  # the schedule counts steps taken (its state is saved, not replayed)
            if parts.ema is not None:
                parts.ema.update(unwrap(model))
        else:
            skipped += 1
        step_metrics = {"loss": float(loss.detach()), "lr": lr, "skipped": float(not stepped)}
        _call(parts.callbacks, "on_step_end", state.step, step_metrics)
        state.step += 1
        state.batch = state.batch + (i + 1 - consumed)
        consumed = i + 1
        state.partial = {"loss_sum": loss_sum, "samples": float(samples), "skipped": float(skipped)}
        if parts.profiler is not None:
            parts.profiler.step()
        if parts.on_step is not None:
            parts.on_step(state)
    return {"loss_sum": loss_sum, "samples": float(samples), "skipped": float(skipped)}


def _call(callbacks: Sequence[Any], hook: str, *args: Any, **kwargs: Any) -> None:
    """Each callback's ``hook`` (a callback implements any subset), as ``fabric.call`` does for Fabric's own."""
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is not None:
            method(*args, **kwargs)


def fit(
    parts: StepParts,
    train_loader: Iterable[Any],
    *,
    epochs: int,
    stop_after: int | None = None,
    seed: int = 0,
    eval_loader: Iterable[Any] | None = None,
    val_loader: Iterable[Any] | None = None,
    state: LoopState | None = None,
    on_epoch_end: Callable[[LoopState, dict[str, float]], None] | None = None,
    log: Callable[[str], None] | None = None,
    rng_state: Callable[[], None] | None = None,
) -> LoopState:
    """Train from ``state.epoch`` up to ``epochs`` (at most ``stop_after`` of them in this call).

    Logs one progress line per epoch on rank 0. Schedules are sized by ``epochs``, so a run cut short
    by ``stop_after`` and resumed follows the same trajectory as an uninterrupted one.

    Each epoch reseeds torch's RNG with ``seed + rank + epoch`` and the loader's shuffling with the
    epoch, so a resumed run continues exactly where a checkpoint left it. Buffers (e.g. BatchNorm
    statistics) are synchronised from rank 0 after each epoch, so all ranks hold identical models.

    A ``state`` saved mid-epoch (``state.batch > 0``) continues that epoch after its last trained
    batch: the epoch's order is drawn in full and cut, and ``rng_state()`` (restoring the generators
    as they were at that step) replaces the epoch's reseeding. A ``state`` saved at an epoch end calls
    ``rng_state()`` before the epoch's torch reseeding, so Python's and NumPy's generators (which the
    reseeding leaves alone: a dataset's own augmentation) continue as they were too. An ``on_step`` hook raising
    :class:`StopTraining` ends the call after that step; ``on_epoch_end`` raising it ends the run
    after that epoch (early stopping). ``val_loader`` adds ``val_accuracy`` / ``val_loss`` (model
    selection), ``eval_loader`` ``test_accuracy`` / ``test_loss``.
    """
    fabric, ema = parts.fabric, parts.ema
    state = state or LoopState()
    log = log if (log is not None and fabric.is_global_zero) else (lambda _line: None)
    end = epochs if stop_after is None else min(epochs, state.epoch + stop_after)
    first = state.epoch
    for epoch in range(state.epoch, end):
        mid_epoch = state.batch > 0
        if not mid_epoch:
            if epoch == first and rng_state is not None:  # resumed at an epoch end
                rng_state()
            torch.manual_seed(seed + fabric.global_rank + 1_000_003 * (epoch + 1))
            state.partial = {}
        set_epoch(train_loader, epoch, seed, skip_batches=state.batch)
        t0 = time.perf_counter()
        try:
            part = train_epoch(parts, train_loader, state, start=rng_state if mid_epoch else None)
        except StopTraining:
            return state
        state.batch, state.partial = 0, {}
        summed = torch.tensor([part["loss_sum"], part["samples"], part["skipped"]], dtype=torch.float64)
        loss_sum, samples, skipped = fabric.all_reduce(summed, reduce_op="sum").tolist()
        broadcast_buffers(parts.model, fabric)
        if ema is not None:  # its BatchNorm statistics average each rank's own batches: rank 0's, as the model's
            broadcast_buffers(ema.module, fabric)
        seconds = time.perf_counter() - t0
        metrics: dict[str, float] = {
            "epoch": epoch + 1,
            "train_loss": loss_sum / max(samples, 1),
            "samples_per_s": samples / max(seconds, 1e-9),
            "skipped_steps": skipped,
        }
        temperature = getattr(parts.loss_fn, "temperature", None)
        if isinstance(temperature, float):
            metrics["temperature"] = temperature
        judged = ema.module if ema is not None else unwrap(parts.model)  # what the checkpoint deploys
        if val_loader is not None:
            ev = evaluate(judged, val_loader, fabric, parts.amp)
            metrics.update(val_accuracy=ev["accuracy"], val_loss=ev["loss"])
        if eval_loader is not None:
            ev = evaluate(judged, eval_loader, fabric, parts.amp)
            metrics.update(test_accuracy=ev["accuracy"], test_loss=ev["loss"])
        state.epoch = epoch + 1
        state.history.append(metrics)
        line = f"epoch {epoch + 1}/{epochs} step {state.step} loss {metrics['train_loss']:.4f}"
        if "val_accuracy" in metrics:
            line += f" val_acc {metrics['val_accuracy']:.4f}"
        if "test_accuracy" in metrics:
            line += f" test_acc {metrics['test_accuracy']:.4f}"
        line += f" {metrics['samples_per_s']:.0f} samples/s {seconds:.2f}s"
        if skipped:
            line += f" ({int(skipped)} steps skipped: non-finite gradients)"
        log(line)
        if not math.isfinite(metrics["train_loss"]):
            log("warning: training loss is not finite")
        _call(parts.callbacks, "on_epoch_end", epoch + 1, metrics)
        if on_epoch_end is not None:
            try:
                on_epoch_end(state, metrics)
            except StopTraining:  # early stopping: this epoch is complete and saved
                return state
    return state


def broadcast_buffers(model: nn.Module, fabric: Any) -> None:
    """Copy rank 0's buffers to every rank (DDP syncs them before forwards, not after the last one)."""
    if fabric.world_size == 1:
        return
    import torch.distributed as dist

    for buf in unwrap(model).buffers():
        dist.broadcast(buf, src=0)
