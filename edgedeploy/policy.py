"""The release gate's policy: which checks must pass, per-precision minimums, latency budgets.

Plain frozen dataclasses without imports from edgedeploy, so ``config.py`` can use them for the
``[gate]`` table of deploy.toml and ``edgedeploy.validate.gate`` for a standalone ``gate.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

CheckKind = Literal["integrity", "parity", "batch_consistency", "latency"]
LatencyMetric = Literal["p50", "p90", "p99"]


@dataclass(frozen=True)
class PerPrecision:
    """One optional number per precision (``None``: no requirement at that precision)."""

    fp32: float | None = None
    fp16: float | None = None
    int8: float | None = None

    def get(self, precision: str) -> float | None:
        """The number for ``precision`` (fp32, fp16, int8); None for any other name."""
        return {"fp32": self.fp32, "fp16": self.fp16, "int8": self.int8}.get(precision)


@dataclass(frozen=True)
class GatePolicy:
    """What ``deploy gate`` (and ``deploy build`` with a ``[gate]`` table or ``--policy``) requires.

    Attributes:
        required_checks: kinds of check that must have run (not skipped) and passed.
        required_backends: backends whose parity must have run and passed, e.g. ``tensorrt-fp16``.
        backends: judge parity only for these backends (empty: every backend in the report).
        min_cosine: per-precision minimum cosine similarity of every output (stricter than the build's).
        min_top1_agreement: per-precision minimum top-1 agreement of classifier outputs.
        max_nonfinite: most NaN + Inf values allowed in any candidate output.
        latency_metric: which percentile the latency rules compare.
        max_latency_regression_pct: most a backend may slow down against ``--baseline``, in percent.
        max_latency_ms: absolute latency budget of the deployed backend at the opt shape.
        baseline: report.json of an earlier build to compare latency with.
    """

    required_checks: tuple[CheckKind, ...] = ("integrity", "parity")
    required_backends: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    min_cosine: PerPrecision = field(default_factory=PerPrecision)
    min_top1_agreement: PerPrecision = field(default_factory=PerPrecision)
    max_nonfinite: int = 0
    latency_metric: LatencyMetric = "p50"
    max_latency_regression_pct: float = 10.0
    max_latency_ms: float | None = None
    baseline: str | None = None
