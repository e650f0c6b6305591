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


def edge_feeds(cfg: DeployConfig, dims: dict[str, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A feed dict like :func:`feeds_with_dims` made of each input's range edges
    (:func:`edgedeploy.modelio.generators.edge_values`)."""
    from edgedeploy.modelio.generators import edge_values

    feeds = {}
    for s in cfg.inputs:
        shape = tuple(d if isinstance(d, int) else dims.get(d, cfg.dims[d].opt) for d in s.shape)
        feeds[s.name] = edge_values(s, shape, rng)
    return feeds


def check_feeds(cfg: DeployConfig, feeds: dict[str, Any], where: str) -> None:
    """Check user-supplied arrays against the input spec: names, rank, fixed sizes, dim ranges.

    Raises:
        InputError: unknown or missing input, wrong rank, a fixed size that differs, a dynamic
            dim outside its [min, max], or the same named dim with two sizes.
    """
    problems = []
    fixes: dict[str, None] = {}  # the fix of each kind of problem found, in order
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
            fixes[f"give {s.name} arrays of shape {list(s.shape)}"] = None
            continue
        seen: dict[str, int] = {}
        for axis, (want, got) in enumerate(zip(s.shape, shape)):
            if isinstance(want, int):
                if want != got:
                    problems.append(f"{s.name}: axis {axis} is {got}, spec fixes it at {want}")
                    fixes[f"give {s.name} arrays of shape {list(s.shape)}"] = None
            else:
                d = cfg.dims[want]
                if not d.min <= got <= d.max:
                    problems.append(f"{s.name}: dim '{want}' (axis {axis}) = {got} is outside [{d.min}, {d.max}]")
                    fixes[f"fit {s.name} into [dims.{want}] min/max, or widen them in the config"] = None
                if seen.setdefault(want, got) != got:
                    problems.append(f"{s.name}: dim '{want}' has two sizes {seen[want]} and {got}")
        for problem, fix in _value_problems(s, feeds[s.name]):
            problems.append(f"{s.name}: {problem}")
            fixes[fix] = None
    if any(p.startswith(("unknown input", "input ")) for p in problems):
        fixes = {f"name the arrays after the model's inputs: {', '.join(sorted(names))}": None, **fixes}
    if problems:
        raise InputError(f"{where}: " + "; ".join(problems), hint="; ".join(fixes) or None)


def _value_problems(spec: InputSpec, value: Any) -> list[tuple[str, str]]:
    """(problem, fix) for what makes ``value`` (an array, or a header with only a shape) unfit for ``spec`` beyond
    its shape: an integer or boolean array for a float input, or NaN / Inf values in a float array."""
    if not isinstance(value, np.ndarray):  # a header (shape alone): nothing more to check
        return []
    if spec.dtype.startswith("float") and value.dtype.kind in "iub":
        problem = f"dtype {value.dtype}, the input is {spec.dtype} (an integer array is not float data)"
        return [(problem, f"save {spec.name} as {spec.dtype}")]
    bad = int(np.count_nonzero(~np.isfinite(value))) if value.dtype.kind == "f" else 0
    if bad:
        return [
            (
                f"holds {bad} NaN/Inf value(s) of {value.size}",
                f"drop or repair the samples of {spec.name} holding NaN/Inf",
            )
        ]
    return []
