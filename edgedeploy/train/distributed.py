"""Data-parallel plumbing on Lightning Fabric under ``torchrun``: devices, the process group, DDP, collectives.

Fabric (``pip install 'edgedeploy[lightning]'``) joins the process group torchrun describes, picks each
rank's device, wraps the model in DDP and holds the rank, world size and collectives; what stays here is
ours: per-rank seeding, FSDP2 sharding, samplers that resume mid-epoch exactly, and rank digests. Runs on
CPU with gloo (``nccl`` on CUDA).
Launch with e.g. ``torchrun --standalone --nproc_per_node 2 -m edgedeploy train --config train.toml --out run``.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
from collections.abc import Iterator, Sized
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
)

from edgedeploy.errors import ConfigError


def lightning_fabric() -> Any:
    """The ``lightning.fabric`` package, imported on first use.

    Raises:
        ConfigError: Lightning is not installed.
    """
    try:
        import lightning.fabric as fabric_pkg
    except ImportError:
        raise ConfigError(
            "deploy train runs on Lightning Fabric, which is not installed", hint="pip install 'edgedeploy[lightning]'"
        ) from None
    return fabric_pkg


def launch(
    device: torch.device,
    seed: int,
    backend: str = "auto",
    *,
    strategy: str = "ddp",
    precision: Any = None,
    ddp: dict[str, bool] | None = None,
) -> Any:
    """Start Fabric on ``device`` (joining torchrun's process group; ``strategy`` ddp: DDP with the ``ddp``
    options, fsdp: FSDP2 over all ranks; ``precision`` as its plugin) and seed this rank with ``seed + rank``.

    Ranks are seeded differently on purpose (dropout and augmentation noise must differ); DDP
    broadcasts rank 0's initial weights, so models still start identical.

    Raises:
        ConfigError: nccl asked for on CPU; bad torchrun environment; Lightning not installed.
    """
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError("distributed backend 'nccl' needs CUDA devices", hint="use backend = 'gloo' on CPU")
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    except ValueError as exc:
        raise ConfigError(
            f"bad torchrun environment ({exc})", hint="launch with torchrun or unset RANK/WORLD_SIZE"
        ) from None
    fabric_pkg = lightning_fabric()
    chosen: Any = "auto"
    pg_backend = None if backend == "auto" else backend
    if strategy == "fsdp" and world > 1:
        chosen = fabric_pkg.strategies.ModelParallelStrategy(
            _shard, data_parallel_size=world, tensor_parallel_size=1, process_group_backend=pg_backend
        )
    elif world > 1 or "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun, even with one rank
        chosen = fabric_pkg.strategies.DDPStrategy(process_group_backend=pg_backend, **(ddp or {}))
    devices: Any = local if world > 1 else ([device.index] if device.index is not None else 1)
    fabric = fabric_pkg.Fabric(
        accelerator=device.type,
        devices=devices,
        num_nodes=max(1, world // max(local, 1)),
        strategy=chosen,
        plugins=[precision] if precision is not None else None,
    )
    quiet = [logging.getLogger(f"lightning.{pkg}") for pkg in ("fabric", "pytorch")]  # its rank banners
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.WARNING)
    try:
        fabric.launch()
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    # Python, NumPy, torch (CPU, CUDA); not Fabric.seed_everything, which would also set PL_SEED_WORKERS
    fabric_pkg.seed_everything((seed + fabric.global_rank) % 2**32, verbose=False)
    return fabric


def cleanup(fabric: Any) -> None:
    """Leave the process group in order: wait for every rank, then destroy it (no-op when not distributed).

    Without the barrier a fast rank could tear down its gloo/nccl threads while a slow one still
    talks to it; the slow rank then aborts at exit ("terminate called without an active exception")
    and torchrun reports failure although the checkpoint was written. Fabric leaves the group up.
    """
    if not dist.is_initialized():
        return
    try:
        fabric.barrier()
    finally:
        dist.destroy_process_group()


def _shard(model: nn.Module, mesh: Any) -> nn.Module:
    """FSDP2 over the data-parallel mesh: each rank holds a shard of every parameter, gathered for
    forward/backward; one unit per top-level block, then the rest (overlapped gathers).

    Raises:
        ConfigError: this torch has no ``fully_shard``.
    """
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        raise ConfigError(
            "run.strategy = 'fsdp' needs torch.distributed.fsdp.fully_shard (torch >= 2.6)",
            hint="use strategy = 'ddp' or upgrade torch",
        ) from None
    with torch.no_grad():  # ranks were seeded apart: start every shard from rank 0's weights, as DDP does
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)
    for child in model.children():
        if any(p.requires_grad for p in child.parameters()):
            fully_shard(child, mesh=mesh["data_parallel"])
    return cast(nn.Module, fully_shard(model, mesh=mesh["data_parallel"]))


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside a Fabric or ``torch.compile`` wrapper (state-dict keys without prefixes)."""
    while True:
        if type(model).__name__ == "_FabricModule":  # Fabric's wrapper around DDP / FSDP
            model = cast(nn.Module, model.module)
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on CPU (a collective under FSDP: every rank must call it)."""
    model = unwrap(model)
    if not any(type(p).__name__ == "DTensor" for p in model.parameters()):  # FSDP2's fully_shard was not applied
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # cpu_offload would hand the full state to rank 0 only; every rank needs it for its weight digest
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    return {k: v.detach().cpu() for k, v in full.items() if isinstance(v, torch.Tensor)}


def local_param_numel(model: nn.Module) -> int:
    """Parameter elements this rank holds (its shards under FSDP, everything otherwise)."""
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in unwrap(model).parameters())


class SkippingSampler(Sampler[int]):
    """A sampler that leaves out the first ``skip`` indices of its inner sampler's epoch.

    The inner sampler draws its whole epoch order as before (same generator calls), so a run resumed
    mid-epoch sees exactly the batches an uninterrupted one would have seen next.
    """

    def __init__(self, sampler: Sampler[int]) -> None:
        self.sampler = sampler
        self.skip = 0

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.skip)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.sampler), self.skip, None)


class EpochLoader:
    """A loader over a streaming dataset cut to ``batches`` per epoch, so every rank runs the same
    number of steps (DDP needs that; a stream has no length of its own)."""

    def __init__(self, loader: DataLoader, batches: int) -> None:
        self.loader = loader
        self.batches = batches
        self.skip = 0  # batches of this epoch already trained on (a mid-epoch resume reads past them)

    def __len__(self) -> int:
        return max(0, self.batches - self.skip)

    def __iter__(self) -> Any:
        return itertools.islice(iter(self.loader), self.skip, self.batches)


def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    seed: int,
    fabric: Any,
    num_workers: int = 0,
    pin_memory: bool = False,
    stream_samples: int | None = None,
) -> DataLoader | EpochLoader:
    """A shuffling loader over this rank's shard (``DistributedSampler``) or, single-process, the whole set.

    Shuffling is seeded per epoch: call :func:`set_epoch` before each epoch so order is reproducible
    and resumable without saving RNG state. An ``IterableDataset`` splits itself by rank and worker;
    ``stream_samples`` (its total size) sets the batches per epoch, equal on every rank.
    """
    extra: dict[str, Any] = {"num_workers": num_workers, "pin_memory": pin_memory}
    if isinstance(dataset, IterableDataset):
        batches = max(1, (stream_samples or 0) // (batch_size * fabric.world_size))
        return EpochLoader(DataLoader(dataset, batch_size=batch_size, **extra), batches)
    generator = None
    if fabric.world_size > 1:
        sampler: Sampler[int] = DistributedSampler(
            dataset, num_replicas=fabric.world_size, rank=fabric.global_rank, shuffle=True, seed=seed
        )
    else:
        generator = torch.Generator().manual_seed(seed)
        sampler = RandomSampler(cast(Sized, dataset), generator=generator)
    return DataLoader(dataset, batch_size=batch_size, sampler=SkippingSampler(sampler), generator=generator, **extra)


def set_epoch(loader: Any, epoch: int, seed: int, skip_batches: int = 0) -> None:
    """Reseed the :func:`make_loader` loader's shuffling for ``epoch`` (sharded, streaming or not) and start
    it after ``skip_batches`` batches (a mid-epoch resume; the epoch's order is drawn in full, then cut)."""
    if isinstance(loader, EpochLoader):
        if hasattr(loader.loader.dataset, "set_epoch"):  # a stream that reshuffles its shards per epoch
            loader.loader.dataset.set_epoch(epoch)
        loader.skip = skip_batches
        return
    sampler = cast(SkippingSampler, loader.sampler)
    sampler.skip = skip_batches * int(loader.batch_size or 1)
    if isinstance(sampler.sampler, DistributedSampler):
        sampler.sampler.set_epoch(epoch)
    elif loader.generator is not None:
        loader.generator.manual_seed(seed + 1000003 * epoch)


def param_digest(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> str:
    """sha256 over the model's state dict bytes (names, dtypes, shapes, values); ``state`` if given."""
    h = hashlib.sha256()
    for name, t in sorted((state if state is not None else unwrap(model).state_dict()).items()):
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def gather_objects(obj: Any, fabric: Any) -> list[Any]:
    """Every rank's ``obj`` (JSON-like data), in rank order: a collective under DDP, ``[obj]`` otherwise.

    ``fabric.all_gather`` takes tensors only; strings and RNG states go through torch's pickling gather.
    """
    if fabric.world_size == 1:
        return [obj]
    out: list[Any] = [None] * fabric.world_size
    dist.all_gather_object(out, obj)
    return out
