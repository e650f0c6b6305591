"""Concrete input tensors from the config's input spec: seeded, in range, at min / opt / max shapes."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgedeploy.config import DeployConfig, InputSpec
from edgedeploy.errors import InputError

SHAPE_POINTS = ("min", "opt", "max")
_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32, "bool": np.bool_}


def random_input(spec: InputSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """One array for ``spec`` at ``shape``, drawn by its kind (``modelio.generators``; ranges inclusive)."""
    from edgedeploy.modelio.generators import generate

    return generate(spec, shape, rng)


def feeds_at(cfg: DeployConfig, point: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A feed dict with every dynamic dim at ``point`` (min / opt / max)."""
    return {s.name: random_input(s, cfg.shape_for(s, point), rng) for s in cfg.inputs}


def feeds_with_dims(cfg: DeployConfig, dims: dict[str, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A feed dict with named dims set to ``dims`` (unlisted dims at opt)."""
    feeds = {}
    for s in cfg.inputs:
        shape = tuple(d if isinstance(d, int) else dims.get(d, cfg.dims[d].opt) for d in s.shape)
        feeds[s.name] = random_input(s, shape, rng)
    return feeds


def check_feeds(cfg: DeployConfig, feeds: dict[str, Any], where: str) -> None:
    """Check user-supplied arrays against the input spec: names, rank, fixed sizes, dim ranges.

    Raises:
        InputError: unknown or missing input, wrong rank, a fixed size that differs, a dynamic
            dim outside its [min, max], or the same named dim with two sizes.
    """
    problems = []
    names = {s.name for s in cfg.inputs}
    for name in feeds:
        if name not in names:
            problems.append(f"unknown input {name!r}")
    for s in cfg.inputs:
        if s.name not in feeds:
            problems.append(f"input {s.name!r} missing")
            continue
        shape = tuple(np.shape(feeds[s.name]))
        if len(shape) != len(s.shape):
            problems.append(f"{s.name}: rank {len(shape)}, spec {list(s.shape)} has rank {len(s.shape)}")
            continue
        seen: dict[str, int] = {}
        for axis, (want, got) in enumerate(zip(s.shape, shape)):
            if isinstance(want, int):
                if want != got:
                    problems.append(f"{s.name}: axis {axis} is {got}, spec fixes it at {want}")
            else:
                d = cfg.dims[want]
                if not d.min <= got <= d.max:
                    problems.append(f"{s.name}: dim '{want}' (axis {axis}) = {got} is outside [{d.min}, {d.max}]")
                if seen.setdefault(want, got) != got:
                    problems.append(f"{s.name}: dim '{want}' has two sizes {seen[want]} and {got}")
    if problems:
        raise InputError(
            f"{where}: " + "; ".join(problems), hint="reshape the data or widen [dims.*] min/max in the config"
        )
