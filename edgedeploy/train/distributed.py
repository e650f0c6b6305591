"""DDP under ``torchrun``: process group setup, per-rank seeding, sharded loading, rank-0-only output.

Runs on CPU with the gloo backend (``nccl`` is used on CUDA). Launch with e.g.
``torchrun --standalone --nproc_per_node 2 -m edgedeploy train --config train.toml --out run``.
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from edgedeploy.errors import ConfigError


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job (world_size 1 when not launched by torchrun)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def dist_info_from_env() -> DistInfo:
    """Read ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` as set by torchrun.

    Raises:
        ConfigError: the variables are present but not integers.
    """
    try:
        return DistInfo(
            rank=int(os.environ.get("RANK", "0")),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
        )
    except ValueError as exc:
        raise ConfigError(
            f"bad torchrun environment ({exc})", hint="launch with torchrun or unset RANK/WORLD_SIZE"
        ) from None


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def setup(device: torch.device, seed: int, backend: str = "auto") -> DistInfo:
    """Join the process group when launched by torchrun and seed this rank with ``seed + rank``.

    Ranks are seeded differently on purpose (dropout and augmentation noise must differ); DDP
    broadcasts rank 0's initial weights, so models still start identical.

    Raises:
        ConfigError: ``backend`` is not one of auto, gloo, nccl; nccl asked for on CPU.
    """
    info = dist_info_from_env()
    if backend not in ("auto", "gloo", "nccl"):
        raise ConfigError(f"distributed backend {backend!r} is not allowed", hint="use auto, gloo or nccl")
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError("distributed backend 'nccl' needs CUDA devices", hint="use backend = 'gloo' on CPU")
    if info.enabled and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend=backend)
    seed_everything(seed + info.rank)
    return info


def cleanup() -> None:
    """Leave the process group (no-op when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: nn.Module, info: DistInfo, device: torch.device) -> nn.Module:
    """``DistributedDataParallel`` around ``model`` when distributed, else the model itself."""
    if not info.enabled:
        return model
    ids = [device.index if device.index is not None else info.local_rank] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside a DDP wrapper (its state-dict keys have no ``module.`` prefix)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def make_loader(
    dataset: Dataset, batch_size: int, *, shuffle: bool, seed: int, info: DistInfo, drop_last: bool = False
) -> DataLoader:
    """A loader over this rank's shard (``DistributedSampler``) or, single-process, the whole set.

    Shuffling is seeded per epoch: call :func:`set_epoch` before each epoch so order is reproducible
    and resumable without saving RNG state.
    """
    if info.enabled:
        sampler: DistributedSampler = DistributedSampler(
            dataset, num_replicas=info.world_size, rank=info.rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last)
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator, drop_last=drop_last)


def set_epoch(loader: DataLoader, epoch: int, seed: int) -> None:
    """Reseed the loader's shuffling for ``epoch`` (sharded or not)."""
    if isinstance(loader.sampler, DistributedSampler):
        loader.sampler.set_epoch(epoch)
    elif loader.generator is not None:
        loader.generator.manual_seed(seed + 1000003 * epoch)


def all_reduce_sum(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Sum scalars over ranks (identity when not distributed)."""
    if not info.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def param_digest(model: nn.Module) -> str:
    """sha256 over the model's state dict bytes (names, dtypes, shapes, values)."""
    h = hashlib.sha256()
    for name, t in sorted(unwrap(model).state_dict().items()):
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def gather_digests(model: nn.Module, info: DistInfo) -> list[str]:
    """Every rank's :func:`param_digest`, in rank order (one entry when not distributed)."""
    mine = param_digest(model)
    if not info.enabled:
        return [mine]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, mine)
    return [str(d) for d in out]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()
