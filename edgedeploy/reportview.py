"""A typed, read-only view of report.json for the host side (the release gate, the build's results table).

Plain data (layer 0). :meth:`ReportView.parse` checks the parts the host reads and names the first key of
the wrong type (``report.json: parity.candidates[1].checks[0].cosine must be a number, got 'x'``); a key
that is absent takes the default the readers always assumed, so reports of older builds still read.
The device copy of the validation code (``complete_bundle.py``, Python 3.6) keeps reading plain dicts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgedeploy.errors import InputError

SCHEMA_PREFIX = "edgedeploy-report/"
LATENCY_METRICS = ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms")


COSINE_SLACK = 1e-6  # a cosine computed in float may exceed 1 by rounding


class _Reader:
    """Typed access to one JSON object, naming ``where`` (a dotted path) in every error."""

    def __init__(self, data: Any, where: str, source: str) -> None:
        if not isinstance(data, Mapping):
            raise _bad(source, where, "an object", data)
        self.data, self.where, self.source = data, where, source

    def _at(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def str_(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key, default)
        if value is None or isinstance(value, str):
            return value
        raise _bad(self.source, self._at(key), "a string", value)

    def text(self, key: str, default: str) -> str:
        value = self.str_(key, default)
        return default if value is None else value

    def num(self, key: str, lo: float | None = None, hi: float | None = None) -> float | None:
        """A finite number within [``lo``, ``hi``] (None: absent). A figure no build writes (NaN, a negative
        error, a cosine above 1) would slip past every minimum and budget the gate compares it with."""
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _bad(self.source, self._at(key), "a finite number", value)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            within = f"a number from {lo:g}" + (f" to {hi:g}" if hi is not None else " up")
            raise _bad(self.source, self._at(key), within if lo is not None else f"a number up to {hi:g}", value)
        return float(value)

    def int_(self, key: str, default: int = 0) -> int:
        """A whole number of at least 0 (counts, indices, exit codes)."""
        value = self.data.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _bad(self.source, self._at(key), "a whole number of at least 0", value)
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        """One of ``choices`` (the report schema's enum), or ``default`` when the key is absent."""
        value = self.text(key, default)
        if key in self.data and value not in choices:
            raise _bad(self.source, self._at(key), "one of " + ", ".join(choices), value)
        return value

    def bool_(self, key: str, default: bool = False) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise _bad(self.source, self._at(key), "true or false", value)
        return value

    def obj(self, key: str) -> _Reader:
        value = self.data.get(key)
        return _Reader({} if value is None else value, self._at(key), self.source)

    def objs(self, key: str) -> list[_Reader]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise _bad(self.source, self._at(key), "a list", value)
        return [_Reader(v, f"{self._at(key)}[{i}]", self.source) for i, v in enumerate(value)]

    def strs(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _bad(self.source, self._at(key), "a list of strings", value)
        return tuple(value)


def _bad(source: str, where: str, expected: str, value: Any) -> InputError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return InputError(
        f"{source}: {where or 'the report'} must be {expected}, got {shown}",
        hint="pass a report.json written by 'deploy build' (unedited)",
    )


@dataclass(frozen=True)
class CheckRow:
    """One comparison of a backend's output with PyTorch (``parity.candidates[].checks[]``)."""

    check: str = "parity"  # parity | batch_consistency
    output: str = "?"
    shape: str | None = None
    sample: int | None = None
    passed: bool = False
    vacuous: bool = False
    reason: str = "failed"
    max_abs: float | None = None
    p99_abs: float | None = None
    cosine: float | None = None
    top1_agreement: float | None = None
    nan: int = 0
    inf: int = 0
    # False: a spec-random golden of an FP16/INT8 artifact, whose agreement figures are informational
    agreement_judged: bool = True
    informational: str | None = None

    @classmethod
    def _read(cls, r: _Reader) -> CheckRow:
        sample = r.data.get("sample")
        return cls(
            check=r.text("check", "parity"),
            output=r.text("output", "?"),
            shape=r.str_("shape"),
            sample=r.int_("sample") if sample is not None else None,
            passed=r.bool_("passed"),
            vacuous=r.bool_("vacuous"),
            reason=r.text("reason", "failed"),
            max_abs=r.num("max_abs", lo=0.0),
            p99_abs=r.num("p99_abs", lo=0.0),
            cosine=r.num("cosine", lo=-1.0 - COSINE_SLACK, hi=1.0 + COSINE_SLACK),
            top1_agreement=r.num("top1_agreement", lo=0.0, hi=1.0),
            nan=r.int_("nan"),
            inf=r.int_("inf"),
            agreement_judged=r.bool_("agreement_judged", True),
            informational=r.str_("informational"),
        )

    @property
    def where(self) -> str:
        """``shape#sample``, as failures name the row (``data (pooled)`` for pooled top-1 rows)."""
        return f"{self.shape} (pooled)" if self.sample is None else f"{self.shape}#{self.sample}"


@dataclass(frozen=True)
class Candidate:
    """One validated (or skipped) backend of the build (``parity.candidates[]``)."""

    name: str = "?"
    status: str = ""  # passed | failed | skipped
    reason: str | None = None
    precision: str = "fp32"
    deploy: bool = False
    checks: tuple[CheckRow, ...] = ()

    @classmethod
    def _read(cls, r: _Reader) -> Candidate:
        return cls(
            name=r.text("name", "?"),
            status=r.choice("status", ("passed", "failed", "skipped"), ""),
            reason=r.str_("reason"),
            precision=r.choice("precision", ("fp32", "fp16", "int8"), "fp32"),
            deploy=r.bool_("deploy"),
            checks=tuple(CheckRow._read(c) for c in r.objs("checks")),
        )


@dataclass(frozen=True)
class Parity:
    """``parity``: the verdict of validation against PyTorch, per backend."""

    status: str = "skipped"
    reason: str | None = None
    candidates: tuple[Candidate, ...] = ()

    @classmethod
    def _read(cls, r: _Reader) -> Parity:
        return cls(
            status=r.text("status", "skipped"),
            reason=r.str_("reason"),
            candidates=tuple(Candidate._read(c) for c in r.objs("candidates")),
        )

    def candidate(self, name: str) -> Candidate | None:
        return next((c for c in self.candidates if c.name == name), None)


@dataclass(frozen=True)
class LatencyRow:
    """One backend's timing (``latency.backends.<name>``): milliseconds per percentile, throughput, shape."""

    ms: Mapping[str, float] = field(default_factory=dict)  # "p50_ms" -> value (the ones the report has)
    throughput: float | None = None
    shape: Any = None

    @classmethod
    def _read(cls, r: _Reader) -> LatencyRow:
        ms = {k: v for k in LATENCY_METRICS if (v := r.num(k, lo=0.0)) is not None}
        return cls(ms=ms, throughput=r.num("throughput", lo=0.0), shape=r.data.get("shape"))

    def value(self, key: str) -> float | None:
        """The timing ``key`` (``"p50_ms"``), None when the report has none."""
        return self.ms.get(key)


@dataclass(frozen=True)
class Latency:
    """``latency``: per-backend timings at one shape, or why there are none."""

    status: str = "skipped"
    reason: str | None = None
    backends: Mapping[str, LatencyRow] = field(default_factory=dict)

    @classmethod
    def _read(cls, r: _Reader) -> Latency:
        rows = r.obj("backends")
        return cls(
            status=r.text("status", "skipped"),
            reason=r.str_("reason"),
            backends={str(name): LatencyRow._read(rows.obj(str(name))) for name in rows.data},
        )


@dataclass(frozen=True)
class BuildFailure:
    """``error``: why a failed build failed."""

    kind: str | None = None
    exit_code: int | None = None
    message: str | None = None


@dataclass(frozen=True)
class ReportView:
    """The host's typed view of one report.json; ``raw`` is the dict it was read from (never changed here)."""

    schema: str
    status: str
    parity: Parity
    latency: Latency
    error: BuildFailure | None = None
    target: str | None = None
    runtime: str | None = None
    precision: str | None = None
    warnings: tuple[str, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, data: Any, source: str = "report.json") -> ReportView:
        """Read ``data`` (report.json's object, or the gate's view of a build in progress).

        Raises:
            InputError: not an edgedeploy report, or a key of the wrong type (its path is named).
        """
        r = _Reader(data, "", source)
        schema = r.str_("schema") or ""
        if not schema.startswith(SCHEMA_PREFIX):
            raise InputError(f"{source}: not an edgedeploy report (no 'schema': '{SCHEMA_PREFIX}...')")
        error = None
        if r.data.get("error"):
            e = r.obj("error")
            code = e.data.get("exit_code")
            error = BuildFailure(e.str_("kind"), e.int_("exit_code") if code is not None else None, e.str_("message"))
        return cls(
            schema=schema,
            status=r.text("status", ""),
            parity=Parity._read(r.obj("parity")),
            latency=Latency._read(r.obj("latency")),
            error=error,
            target=r.str_("target"),
            runtime=r.str_("runtime"),
            precision=r.str_("precision"),
            warnings=r.strs("warnings"),
            raw=r.data,
        )

    def refuse_unmeasured_latency(self, key: str, source: str) -> None:
        """For a baseline: every timing ``key`` must be a positive finite number (a 0 or NaN baseline would make
        any regression read as +0%).

        Raises:
            InputError: the backends whose ``key`` is missing or not a measurement (all named).
        """
        bad = []
        for name, row in self.latency.backends.items():
            value = row.value(key)
            if value is None or not math.isfinite(value) or value <= 0:
                bad.append(f"{name} {key} = {value!r}")
        if bad:
            raise InputError(
                f"baseline {source}: " + "; ".join(bad) + " is not a latency measurement",
                hint="pass the report.json of a build whose latency was measured, or drop --baseline",
            )


# what each input-set label of the results table means (the table's legend prints the ones it used)
INPUT_LABELS = {
    "min": "seeded random inputs in inputs.range at the [dims] min shape",
    "opt": "the same at the opt shape",
    "max": "the same at the max shape",
    "data": "the batches of validate.data (without it: calibration batches)",
    "calib-heldout": "calibration samples held out from INT8 calibration (judged on, never calibrated on)",
    "real": "top-1 agreement pooled over the real-data goldens (data, calib-heldout); its own verdict",
    "all": "top-1 agreement pooled over every golden (no real data given); its own verdict",
}
BATCH_LABEL = "batch consistency: opt sample 0 repeated into a batch of {n}; every row must give the same output"


def input_legend(rows: Sequence[CheckRow | Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(label, meaning) for each input-set label ``rows`` use (x<N> for batch consistency), in table order, then
    the sample column and ``vacuous`` when used. ``rows``: CheckRows or report.json check dicts."""
    checks = [c if isinstance(c, CheckRow) else CheckRow._read(_Reader(c, "check", "report")) for c in rows]
    seen: list[str] = []
    for c in checks:
        if c.shape and c.shape not in seen:
            seen.append(c.shape)
    out = []
    for label in seen:
        if label in INPUT_LABELS:
            out.append((label, INPUT_LABELS[label]))
        elif label.startswith("x") and label[1:].isdigit():
            out.append((label, BATCH_LABEL.format(n=label[1:])))
    if any(c.sample is not None for c in checks):
        out.append(("sample", "the batch's index within its input set; 'pooled': one figure over many batches"))
    if any(c.passed and c.vacuous for c in checks):
        out.append(("vacuous", "passed, but PyTorch and the backend give a constant output, or one for every input"))
    return out
