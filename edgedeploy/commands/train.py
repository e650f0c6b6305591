"""``deploy train``: train a model from train.toml and write a checkpoint ``deploy build`` reads as is."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a model and write a deployable checkpoint (safetensors + metadata)",
        description="Single process, or under torchrun for DDP/FSDP: "
        "torchrun --standalone --nproc_per_node 2 -m edgedeploy train --config train.toml --out run; "
        "several nodes: torchrun --nnodes N --node_rank R --rdzv_backend c10d --rdzv_endpoint HOST:PORT "
        "--rdzv_id JOB ... (see docs/training.md). data.batch_size is per rank.",
    )
    p.add_argument("--config", "-c", required=True, help="path to train.toml")
    p.add_argument("--out", "-o", required=True, help="output folder for the checkpoint")
    p.add_argument("--resume", action="store_true", help="continue from OUT/<checkpoint.name>.safetensors")
    p.add_argument("--epochs", type=int, default=None, help="override run.epochs")
    p.add_argument(
        "--stop-after", type=int, default=None, metavar="N", help="stop after N epochs in this call; --resume later"
    )
    p.add_argument(
        "--stop-after-steps",
        type=int,
        default=None,
        metavar="N",
        help="stop after N optimizer steps in this call (mid-epoch is fine); --resume later",
    )
    p.add_argument(
        "--find-lr",
        action="store_true",
        help="only run the LR range test: OUT/lr_finder.json (+ .png) and the suggested lr; no training",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from edgedeploy.errors import ConfigError
    from edgedeploy.train.config import load_train_config
    from edgedeploy.train.runner import run_training

    cfg = load_train_config(args.config)
    if args.epochs is not None:
        if args.epochs < 1:
            raise ConfigError(f"flag --epochs must be >= 1, got {args.epochs}")
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, epochs=args.epochs))
    if args.stop_after is not None and args.stop_after < 1:
        raise ConfigError(f"flag --stop-after must be >= 1, got {args.stop_after}")
    if args.stop_after_steps is not None and args.stop_after_steps < 1:
        raise ConfigError(f"flag --stop-after-steps must be >= 1, got {args.stop_after_steps}")
    result = run_training(
        cfg,
        args.out,
        resume=args.resume or None,
        stop_after=args.stop_after,
        stop_after_steps=args.stop_after_steps,
        find_lr=args.find_lr,
    )
    if args.find_lr:
        if _is_main():
            print(f"LR FINDER: suggested lr {result.metrics['suggested_lr']:.3e} -> {args.out}/lr_finder.json")
        if result.world_size > 1:
            leave_distributed_worker(0)
        return 0
    if result.state.history and _is_main():
        m = result.metrics
        acc = f", test accuracy {m['test_accuracy']:.4f}" if "test_accuracy" in m else ""
        print(f"TRAINED: {result.state.epoch} epochs, {result.state.step} steps{acc} -> {result.checkpoint}")
    if result.world_size > 1:
        leave_distributed_worker(0)
    return 0


def leave_distributed_worker(code: int) -> None:
    """End a torchrun worker now, after its output is flushed, without interpreter finalization.

    The process group is already destroyed (``edgedeploy.train.distributed.cleanup``), yet with DDP torch
    2.14's gloo worker threads outlive it, and one may still be releasing the last collectives' work (the
    final barrier holding the replica-digest all-gather's tensors) while Python finalizes. Releasing a tensor
    with a Python object takes the GIL; during finalization that ends the thread by a forced unwind through
    a noexcept frame: "terminate called without an active exception", SIGABRT, and torchrun reports the
    run failed although the checkpoint was written (gdb backtrace: ``ProcessGroupGloo::runLoop`` ->
    ``~AsyncBarrierWork`` -> ``~AsyncAllgatherWork`` -> ``decref_pyobject`` -> ``take_gil`` ->
    ``pthread_exit``, main thread in ``Py_FinalizeEx``). Nothing is left to finalize: the checkpoint and its
    sidecar are closed files, TensorBoard's writer is closed by the runner.
    """
    import logging
    import os
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _is_main() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"
