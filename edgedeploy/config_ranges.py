"""Numeric config values checked at the door: finite, in range, and shapes that fit in memory.

A tolerance of ``atol = -1`` or ``nan`` or a gate minimum cosine of 2.0 is a typo, not a parity
failure; ``samples = 0`` without ``validate.data`` or ``topk = 0`` would silently check nothing;
a ``dims.batch.max`` of 10^9 would try to allocate terabytes. Every problem is collected, then one
ConfigError names them all.
"""

from __future__ import annotations

import math
import os
from typing import Any

from edgedeploy.errors import ConfigError

_ITEMSIZE = {"float32": 4, "float16": 2, "int64": 8, "int32": 4, "bool": 1}
# the inputs at the max shape may take at most this share of physical memory: the model's
# activations and the reference outputs need many times the input
MAX_INPUT_SHARE = 0.25


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(problems: list[str], key: str, value: Any, lo: float | None, hi: float | None, what: str) -> None:
    if value is None:
        return
    if not _number(value) or not math.isfinite(value):
        problems.append(f"'{key}' = {value!r} must be a finite number ({what})")
    elif (lo is not None and value < lo) or (hi is not None and value > hi):
        problems.append(f"'{key}' = {value!r} must be {what}")


def policy_problems(policy: Any, prefix: str = "") -> list[str]:
    """Out-of-range numbers in a gate policy (``prefix`` is ``gate.`` inside deploy.toml)."""
    problems: list[str] = []
    for precision in ("fp32", "fp16", "int8"):
        _check(problems, f"{prefix}min_cosine.{precision}", policy.min_cosine.get(precision), -1, 1, "in [-1, 1]")
        top1 = policy.min_top1_agreement.get(precision)
        _check(problems, f"{prefix}min_top1_agreement.{precision}", top1, 0, 1, "in [0, 1]")
    _check(problems, f"{prefix}max_nonfinite", policy.max_nonfinite, 0, None, ">= 0")
    _check(problems, f"{prefix}max_latency_regression_pct", policy.max_latency_regression_pct, 0, None, ">= 0")
    _check(problems, f"{prefix}max_latency_ms", policy.max_latency_ms, 1e-9, None, "> 0")
    if policy.baseline is not None and not str(policy.baseline).strip():  # an empty path would judge no baseline
        problems.append(f"'{prefix}baseline' = '' names no report (remove the key, or give a report.json path)")
    return problems


def config_problems(cfg: Any) -> list[str]:
    """Out-of-range numbers in a deploy config, each naming its dotted key."""
    problems: list[str] = []
    for name, tol in cfg.tolerance.items():
        _check(problems, f"tolerance.{name}.atol", tol.atol, 0, None, ">= 0")
        _check(problems, f"tolerance.{name}.rtol", tol.rtol, 0, None, ">= 0")
        _check(problems, f"tolerance.{name}.min_cosine", tol.min_cosine, -1, 1, "in [-1, 1]")
        _check(problems, f"tolerance.{name}.min_topk_agreement", tol.min_topk_agreement, 0, 1, "in [0, 1]")
    v = cfg.validate
    if v.data:  # the user's data is checked, so random batches may be left out (random token ids are not text)
        _check(problems, "validate.samples", v.samples, 0, None, ">= 0")
    else:
        _check(problems, "validate.samples", v.samples, 1, None, ">= 1 (or set validate.data)")
    _check(problems, "validate.topk", v.topk, 1, None, ">= 1")
    _check(problems, "validate.seed", v.seed, 0, 2**32 - 1, "in [0, 2**32 - 1]")
    _check(problems, "validate.latency_iters", v.latency_iters, 1, None, ">= 1 (every build times its artifact)")
    _check(problems, "validate.latency_warmup", v.latency_warmup, 0, None, ">= 0")
    _check(problems, "validate.goldens_budget_mb", v.goldens_budget_mb, 0.001, None, ">= 0.001")
    p = cfg.precision
    _check(problems, "precision.calib_samples", p.calib_samples, 1, None, ">= 1")
    _check(problems, "precision.accuracy_target", p.accuracy_target, 0, 1, "in [0, 1]")
    _check(problems, "precision.max_fallback_tries", p.max_fallback_tries, 0, None, ">= 0")
    _check(problems, "precision.time_budget_s", p.time_budget_s, 0, None, ">= 0")
    _check(problems, "build.workspace_mib", cfg.build.workspace_mib, 1, None, ">= 1")
    _check(problems, "build.dla_core", cfg.build.dla_core, 0, None, ">= 0")
    for i, spec in enumerate(cfg.inputs):
        lo, hi = spec.range
        if not all(_number(x) and math.isfinite(x) for x in (lo, hi)):
            problems.append(f"'inputs[{i}].range' = [{lo}, {hi}] must be two finite numbers")
    if cfg.gate is not None:
        problems += policy_problems(cfg.gate, "gate.")
    problems += memory_problems(cfg)
    return problems


def physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def memory_problems(cfg: Any, memory: int | None = None) -> list[str]:
    """The inputs at the max shape, estimated before anything is allocated, against physical memory."""
    memory = memory if memory is not None else physical_memory()
    if not memory:
        return []
    total = 0
    for spec in cfg.inputs:
        total += math.prod(cfg.shape_for(spec, "max")) * _ITEMSIZE.get(spec.dtype, 4)
    if total <= memory * MAX_INPUT_SHARE:
        return []
    dims = ", ".join(f"dims.{n}.max = {d.max}" for n, d in cfg.dims.items())
    return [
        f"the inputs at their max shape need {total / 2**30:.1f} GiB ({dims or 'fixed shapes'}), more than "
        f"{MAX_INPUT_SHARE:.0%} of this machine's {memory / 2**30:.1f} GiB memory"
    ]


def raise_if_problems(problems: list[str], where: str) -> None:
    """One ConfigError naming every problem.

    Raises:
        ConfigError: ``problems`` is not empty.
    """
    if problems:
        more = f" (+{len(problems) - 1} more: " + "; ".join(problems[1:]) + ")" if len(problems) > 1 else ""
        raise ConfigError(f"{where}: key {problems[0]}{more}", hint="fix the value(s) in the config or flag")
