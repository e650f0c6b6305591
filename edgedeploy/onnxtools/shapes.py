"""Shape probes: the dynamic-dim sizes a captured or exported model is run at, and the checks on the results.

A model whose "dynamic" dims were baked in works at the example size and breaks (or
returns the wrong shape) at another one; running it at min, opt, max and one random
in-range value of every named dim, one dim at a time, finds that and names the dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgedeploy.config import DeployConfig
from edgedeploy.modelio.inputs import edge_feeds, feeds_with_dims


@dataclass(frozen=True)
class ProbePoint:
    """One set of dynamic-dim sizes; ``varied`` is the dim that differs from opt (None: all at opt)."""

    label: str
    dims: dict[str, int]
    varied: str | None = None


def used_dims(cfg: DeployConfig) -> list[str]:
    """Named dims that some input uses, in first-use order."""
    names: list[str] = []
    for spec in cfg.inputs:
        for d in spec.shape:
            if isinstance(d, str) and d not in names:
                names.append(d)
    return names


PROBE_SEED = 1  # offset from validate.seed of the shape probes the capture and export stages share


def probe_points(cfg: DeployConfig, seed: int = 0) -> list[ProbePoint]:
    """opt for every dim, then per dim: min, max and one seeded random value in [min, max] (others at opt)."""
    rng = np.random.default_rng(seed)
    opt = {n: cfg.dims[n].opt for n in used_dims(cfg)}
    points = [ProbePoint("opt", dict(opt))]
    seen = {tuple(sorted(opt.items()))}
    for name in used_dims(cfg):
        d = cfg.dims[name]
        # the random size avoids min / opt / max so it adds a size not probed yet (when there is one)
        spare = [v for v in range(d.min + 1, d.max) if v != d.opt][:4096]
        sizes = [("min", d.min), ("max", d.max)] + ([("random", int(rng.choice(spare)))] if spare else [])
        for which, size in sizes:
            dims = {**opt, name: size}
            key = tuple(sorted(dims.items()))
            if key in seen:
                continue
            seen.add(key)
            points.append(ProbePoint(f"{name}={size} ({which})", dims, name))
    if cfg.export.edge_probe:  # last, so the random draws above stay as they were
        points.append(ProbePoint(EDGE_POINT, _edge_dims(cfg, opt)))
    return points


# the probe point whose inputs are their ranges' edges (zeros, both ends, ends alternating), not draws
EDGE_POINT = "range edges"


def _edge_dims(cfg: DeployConfig, opt: dict[str, int]) -> dict[str, int]:
    """opt, with the leading dim of the first input that names one raised (within its max) to hold a row of
    every edge pattern: no larger than the opt point where a batch of opt rows holds them all already."""
    from edgedeploy.modelio.generators import EDGE_PATTERNS

    dims = dict(opt)
    lead = next((s.shape[0] for s in cfg.inputs if s.shape and isinstance(s.shape[0], str)), None)
    if lead is not None:
        d = cfg.dims[lead]
        dims[lead] = max(d.opt, min(d.max, len(EDGE_PATTERNS)))
    return dims


def probe_feeds(cfg: DeployConfig, points: list[ProbePoint], seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Seeded random inputs for each probe point; the range edges at :data:`EDGE_POINT`."""
    rng = np.random.default_rng(seed)
    return [(edge_feeds if p.label == EDGE_POINT else feeds_with_dims)(cfg, p.dims, rng) for p in points]


def example_dims(cfg: DeployConfig) -> dict[str, int]:
    """Dim sizes for the capture / export example: opt, but at least 2 where the range allows.

    torch.export specialises dims whose example size is 0 or 1, so an example of 1 would bake them.
    """
    out = {}
    for name in used_dims(cfg):
        d = cfg.dims[name]
        out[name] = d.opt if d.opt >= 2 or d.max < 2 else min(2, d.max)
    return out


def export_dynamic_shapes(cfg: DeployConfig) -> tuple[Any, ...]:
    """``dynamic_shapes`` for torch.export / the dynamo ONNX exporter: one ``torch.export.Dim`` per named dim.

    Dims whose min equals max are static and get no Dim. The same name in two inputs shares one Dim.
    """
    import torch

    dims = {}
    for name in used_dims(cfg):
        d = cfg.dims[name]
        if d.min < d.max:
            dims[name] = torch.export.Dim(name, min=d.min, max=d.max)
    shapes: list[Any] = []
    for spec in cfg.inputs:
        axes = {i: dims[n] for i, n in cfg.dynamic_dims(spec).items() if n in dims}
        shapes.append(axes or None)
    return tuple(shapes)


def output_axes(points: list[ProbePoint], references: list[dict[str, np.ndarray]]) -> dict[str, dict[int, str]]:
    """Output axes whose size changes between probe points, named by the dim varied at that point.

    An axis that follows two dims (a flattened one) gets a name of its own. ``points[0]`` is opt.
    """
    base = references[0]
    axes: dict[str, dict[int, str]] = {}
    for point, outs in zip(points[1:], references[1:]):
        if point.label == EDGE_POINT:  # every dim at once: the one-dim-at-a-time points name the axes
            continue
        for name, arr in outs.items():
            for i, (a, b) in enumerate(zip(base[name].shape, arr.shape)):
                if a != b:
                    named = axes.setdefault(name, {})
                    label = point.varied or f"{name}_{i}"
                    named[i] = label if named.get(i, label) == label else f"{name}_{i}"
    return axes


def compare_shapes(
    points: list[ProbePoint],
    feeds: list[dict[str, np.ndarray]],
    run_candidate: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
    references: list[dict[str, np.ndarray]],
    *,
    atol: float | None = None,
    rtol: float = 0.0,
) -> tuple[list[str], dict[str, Any]]:
    """Run the candidate at every probe point and compare with the reference outputs there.

    Problems name the point (and so the dim). Returns (problems, per-point figures). With ``atol``
    the values are compared too: the largest difference may be ``atol + rtol * max|reference|``.
    """
    problems: list[str] = []
    figures: dict[str, Any] = {}
    for point, feed, ref in zip(points, feeds, references):
        try:
            got = run_candidate(feed)
        except Exception as exc:  # a runtime refusing the shape is exactly what this looks for
            problems.append(f"at {point.label}: fails to run ({type(exc).__name__}: {_short(exc)})")
            figures[point.label] = {"ok": False}
            continue
        worst = 0.0
        bad = []
        for name, r in ref.items():
            g = got.get(name)
            if g is None:
                bad.append(f"output {name!r} missing")
            elif tuple(g.shape) != tuple(r.shape):
                bad.append(f"output {name!r} has shape {list(g.shape)}, PyTorch gives {list(r.shape)}")
            elif atol is not None and r.size:
                g64, r64 = g.astype(np.float64), r.astype(np.float64)
                # NaN where PyTorch gives NaN too is the same answer (0/0 at a range edge); NaN on one side only
                # differs, and so does an infinity of another sign
                same = (np.isnan(g64) & np.isnan(r64)) | (np.isinf(r64) & (g64 == r64))
                with np.errstate(invalid="ignore"):  # inf - inf where both agree: masked by ``same``
                    gap = np.abs(np.where(same, 0.0, g64 - r64))
                diff = float(np.max(np.nan_to_num(gap, nan=np.inf, posinf=np.inf)))
                worst = max(worst, diff)
                finite = np.abs(r[np.isfinite(r)]).astype(np.float64)
                bound = atol + rtol * (float(finite.max()) if finite.size else 0.0)
                if not diff <= bound:
                    odd = " (NaN or infinity where PyTorch differs)" if np.isinf(diff) else ""
                    bad.append(f"output {name!r} differs from PyTorch by {diff:.3g} (> {bound:.3g}){odd}")
        figures[point.label] = {"ok": not bad, "max_abs": worst}
        problems.extend(f"at {point.label}: {b}" for b in bad)
    return problems, figures


def _short(exc: BaseException, n: int = 240) -> str:
    text = " ".join(str(exc).split())
    return text[:n] + ("..." if len(text) > n else "")
