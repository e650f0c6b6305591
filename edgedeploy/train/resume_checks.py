"""Checks on a resumable state before anything in it is used: a file edited by hand, or written by a run with
another optimizer, schedule or batching, fails in one line naming the field, not as a traceback mid-training.

Domain layer: imports torch, numpy and the train package's loop state only.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgedeploy.errors import CheckpointError
from edgedeploy.train.loop import LoopState

FRESH = "train from the start into another folder (--out), or restore the file the run wrote"


def _bad(ckpt: Path, field: str, why: str, hint: str = FRESH) -> CheckpointError:
    return CheckpointError(f"{ckpt}: its resumable state's {field} {why}", hint=hint)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))


def loop_state(saved: Mapping[str, Any], ckpt: Path) -> LoopState:
    """The saved loop counters, checked.

    Raises:
        CheckpointError: a counter is not a whole number >= 0, or the history is not a list of metrics.
    """
    loop = saved.get("loop", {})
    if not isinstance(loop, Mapping):
        raise _bad(ckpt, "loop", "is not a table")
    for key in ("epoch", "step", "optimizer_steps", "batch"):
        if key in loop and not (isinstance(loop[key], int) and not isinstance(loop[key], bool) and loop[key] >= 0):
            raise _bad(ckpt, f"loop.{key}", f"is {loop[key]!r}, not a whole number >= 0")
    history = loop.get("history", [])
    if not isinstance(history, list) or not all(
        isinstance(h, Mapping) and all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in h.items())
        for h in history
    ):
        raise _bad(ckpt, "loop.history", "is not a list of metric tables (name -> number)")
    partial = loop.get("partial", {})
    if not isinstance(partial, Mapping) or not all(_number(v) for v in partial.values()):
        raise _bad(ckpt, "loop.partial", "is not a table of numbers")
    return LoopState.from_dict(dict(loop))


def run_fits(
    saved: Mapping[str, Any], run: Mapping[str, Any], state: LoopState, ckpt: Path, *, scheduled: bool = False
) -> None:
    """The run that wrote the state used this run's optimizer and schedule kind (and, for a mid-epoch state,
    its batching), on the same kind of device in the same precision, and, with an LR schedule (``scheduled``), one
    sized for this run's length: ``run`` holds this run's ``optimizer``, ``kind`` (of schedule), ``device``
    (type), ``precision`` (resolved: fp32, bf16, fp16), ``batch_size``, ``accumulate``, ``epochs`` and ``steps``.
    A state written before these were recorded is not checked.

    Raises:
        CheckpointError: the recorded run differs, with how to resume it. Another device or precision would change
            the numbers mid-run (a run moved from a GPU to the CPU also from fp16 to bf16 under ``auto``). A
            schedule sized for other epochs or steps would run out (cosine at lr 0 for the added epochs, onecycle
            failing mid-run) or stop short.
    """
    was = saved.get("schedule")
    if not isinstance(was, Mapping):
        return
    for key, what in (("optimizer", "optimizer"), ("kind", "LR schedule")):
        if key in was and was[key] != run[key]:
            raise CheckpointError(
                f"{ckpt}: saved by a run with the {was[key]} {what}; this run's {what} is {run[key]}",
                hint=f"resume with the {what} the run started with ({was[key]}), or train a new run (--out)",
            )
    # another device or precision would go on training, with other numbers: never changed silently mid-run
    for key, on in (("device", "on"), ("precision", "in")):
        if key in was and was[key] != run[key]:
            raise CheckpointError(
                f"{ckpt}: saved by a run training {on} {was[key]}; this run trains {on} {run[key]}",
                hint=f"resume with run.{key} = '{was[key]}', or train a new run into another folder (--out) from "
                "this checkpoint's weights",
            )
    if state.batch:
        for key in ("batch_size", "accumulate"):
            if key in was and was[key] != run[key]:
                raise CheckpointError(
                    f"{ckpt}: saved mid-epoch with {key} {was[key]}; this run has {run[key]}, so the batches "
                    "already trained on cannot be skipped",
                    hint=f"resume with {key} = {was[key]} (or from an epoch-end checkpoint)",
                )
    if scheduled and (was.get("epochs"), was.get("steps")) != (run["epochs"], run["steps"]):
        raise CheckpointError(
            f"{ckpt}: its {run['kind']} LR schedule is sized for {was.get('epochs')} epochs "
            f"({was.get('steps')} steps); this run asks for {run['epochs']} ({run['steps']} steps)",
            hint=f"resume with --epochs {was.get('epochs')} (and the same batch size), or train a new run into "
            "another folder (--out) from this checkpoint's weights",
        )


def optimizer_groups(optimizer: torch.optim.Optimizer, ckpt: Path) -> None:
    """The loaded param groups hold numbers where the optimizer computes with them.

    Raises:
        CheckpointError: a group's learning rate, weight decay, momentum or betas is not a finite number.
    """
    for i, group in enumerate(optimizer.param_groups):
        for key in ("lr", "initial_lr", "weight_decay", "momentum", "eps"):
            if key in group and not _number(group[key]):
                raise _bad(ckpt, f"param_groups[{i}].{key}", f"is {group[key]!r}, not a number")
        betas = group.get("betas")
        if betas is not None and not (isinstance(betas, (list, tuple)) and all(_number(b) for b in betas)):
            raise _bad(ckpt, f"param_groups[{i}].betas", f"is {betas!r}, not two numbers")


def schedule_runs(scheduler: Any, ckpt: Path) -> None:
    """The restored schedule computes a rate at its step (its saved fields are of the right types).

    Raises:
        CheckpointError: computing the rate fails or gives no finite number.
    """
    if scheduler is None:
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # get_lr() outside step() warns; here it is a trial
            rates = scheduler.get_lr()
        ok = all(_number(float(r)) for r in rates)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as exc:
        raise _bad(ckpt, "scheduler", f"cannot compute a rate ({type(exc).__name__}: {exc})") from None
    if not ok:
        raise _bad(ckpt, "scheduler", "computes a rate that is not a finite number")


def rng_states(ranks: Any, ckpt: Path) -> None:
    """Every rank's saved generator states can be put back (tried on throwaway generators).

    Raises:
        CheckpointError: a state is missing a generator or has the wrong form.
    """
    if not isinstance(ranks, list):
        raise _bad(ckpt, "rng", "is not a list of per-rank states")
    for i, state in enumerate(ranks):
        try:
            torch.Generator().set_state(torch.tensor(state["torch"], dtype=torch.uint8))
            version, mt, gauss = state["python"]
            random.Random().setstate((version, tuple(mt), gauss))
            kind, keys, pos, has_gauss, cached = state["numpy"]
            np.random.RandomState().set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
            if "cuda" in state:
                torch.tensor(state["cuda"], dtype=torch.uint8)
        except (TypeError, ValueError, KeyError, RuntimeError, OverflowError) as exc:
            raise _bad(ckpt, f"rng[{i}]", f"cannot be restored ({type(exc).__name__}: {exc})") from None


def amp_state(state: Any, ckpt: Path) -> None:
    """The GradScaler state holds numbers.

    Raises:
        CheckpointError: a field is not a number.
    """
    if not isinstance(state, Mapping):
        raise _bad(ckpt, "amp", "is not a table")
    for key in ("skipped_steps", "steps"):
        if key in state and not _number(state[key]):
            raise _bad(ckpt, f"amp.{key}", f"is {state[key]!r}, not a number")
    scaler = state.get("scaler") or {}
    if not isinstance(scaler, Mapping) or not all(_number(v) for v in scaler.values()):
        raise _bad(ckpt, "amp.scaler", "is not a table of numbers")


def loss_state(loss_fn: torch.nn.Module, state: Any, ckpt: Path) -> None:
    """Load the learned loss parameters.

    Raises:
        CheckpointError: they are not this loss's parameters, or not numbers.
    """
    if not isinstance(state, Mapping):
        raise _bad(ckpt, "loss", "is not a table")
    try:
        loss_fn.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    except (RuntimeError, TypeError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        raise _bad(ckpt, "loss", f"does not fit loss.kind's parameters ({first})") from None
