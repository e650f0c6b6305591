"""Latency benchmark: warm-up runs, then timed runs; p50 / p90 / p99 latency and throughput."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def time_calls(
    run: Callable[[dict[str, np.ndarray]], Any],
    feeds: dict[str, np.ndarray],
    *,
    warmup: int,
    iters: int,
    own_time: Callable[[], float | None] | None = None,
) -> dict[str, Any]:
    """Call ``run(feeds)`` ``warmup`` times untimed, then ``iters`` times timed.

    Each run's time is ``own_time()`` (seconds the backend itself reports for the last call) when
    given and not None, else the wall time of the call. Returns p50 / p90 / p99 / mean / min in
    milliseconds, and throughput counted, not derived from a percentile: the timed batches divided by
    their summed time (the same per-run time the percentiles use, slow runs included), in batches and in
    samples per second (batch = leading axis of the first feed).
    """
    for _ in range(warmup):
        run(feeds)
    times = []
    for _ in range(max(iters, 1)):
        t0 = time.perf_counter()
        run(feeds)
        wall = time.perf_counter() - t0
        own = own_time() if own_time is not None else None
        times.append((own if own else wall) * 1e3)
    loop_s = sum(times) / 1e3
    first = next(iter(feeds.values()), None)
    batch = int(first.shape[0]) if first is not None and first.ndim else 1
    batches_per_s = len(times) / loop_s if loop_s > 0 else 0.0
    return {
        "p50_ms": float(np.percentile(times, 50)),
        "p90_ms": float(np.percentile(times, 90)),
        "p99_ms": float(np.percentile(times, 99)),
        "mean_ms": float(np.mean(times)),
        "min_ms": float(np.min(times)),
        "batches_per_s": batches_per_s,
        "throughput": batch * batches_per_s,
        "timed_s": loop_s,
        "batch": batch,
        "iters": len(times),
        "warmup": warmup,
        "shape": {k: list(v.shape) for k, v in feeds.items()},
    }


def measure(runner: Any, feeds: dict[str, np.ndarray], *, warmup: int, iters: int) -> dict[str, Any]:
    """:func:`time_calls` for an active polygraphy runner, timed by its ``last_inference_time()``
    (the backend call alone, without polygraphy's input checks)."""
    return time_calls(
        lambda f: runner.infer(f, check_inputs=False),
        feeds,
        warmup=warmup,
        iters=iters,
        own_time=runner.last_inference_time,
    )
