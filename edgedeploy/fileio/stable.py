"""Byte-stable JSON for hashed artifacts: sorted keys, and no timings (they belong in the report)."""

from __future__ import annotations

import json
from typing import Any

# keys whose values are measured times: they differ on every run, so they never enter a hashed file
TIMING_SUFFIXES = ("_ms", "seconds", "_s")
TIMING_PREFIXES = ("latency",)


def is_timing(key: str) -> bool:
    return key.endswith(TIMING_SUFFIXES) or key.startswith(TIMING_PREFIXES)


def without_timings(value: Any) -> Any:
    """``value`` with every timing key removed, at any depth."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if not (isinstance(k, str) and is_timing(k))}
    if isinstance(value, (list, tuple)):
        return [without_timings(v) for v in value]
    return value


def stable_json(value: Any) -> str:
    """Canonical text for a hashed JSON artifact: timings dropped, keys sorted, floats as repr."""
    return json.dumps(without_timings(value), indent=2, sort_keys=True, default=float) + "\n"
