"""Training utilities: checkpoint parameter diff, peak-memory monitor, profiler hook, anomaly toggle."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from edgedeploy.modelio.checkpoint import read_state_dict

# ---- parameter diff ---------------------------------------------------------------------------


@dataclass
class ParamDiff:
    """How two checkpoints differ: per-tensor mean/max absolute difference, and keys that do not pair up."""

    changes: dict[str, dict[str, float]] = field(default_factory=dict)
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    shape_mismatch: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        return (
            not self.only_in_a
            and not self.only_in_b
            and not self.shape_mismatch
            and all(c["max_abs"] == 0 for c in self.changes.values())
        )

    def changed(self, atol: float = 0.0) -> list[str]:
        """Names of tensors whose largest absolute difference exceeds ``atol``."""
        return [k for k, c in self.changes.items() if c["max_abs"] > atol]


StateSource = str | Path | Mapping[str, torch.Tensor] | torch.nn.Module


def _state(source: StateSource, parameters_only: bool = False) -> dict[str, torch.Tensor]:
    if isinstance(source, torch.nn.Module):
        return dict(source.named_parameters()) if parameters_only else source.state_dict()
    return read_state_dict(source) if isinstance(source, (str, Path)) else dict(source)


def param_diff(a: StateSource, b: StateSource) -> ParamDiff:
    """Compare two checkpoints (paths, read without unpickling code), state dicts or models tensor by
    tensor (a model by its ``state_dict()``: parameters and buffers).

    Raises:
        CheckpointError: a path is missing, corrupt or carries pickled code.
    """
    sa, sb = _state(a), _state(b)
    diff = ParamDiff(only_in_a=sorted(sa.keys() - sb.keys()), only_in_b=sorted(sb.keys() - sa.keys()))
    for name in sorted(sa.keys() & sb.keys()):
        ta, tb = sa[name].detach().cpu(), sb[name].detach().cpu()
        if ta.shape != tb.shape:
            diff.shape_mismatch[name] = (tuple(ta.shape), tuple(tb.shape))
            continue
        delta = (ta.double() - tb.double()).abs()
        diff.changes[name] = {
            "mean_abs": float(delta.mean()) if delta.numel() else 0.0,
            "max_abs": float(delta.max()) if delta.numel() else 0.0,
        }
    return diff


def model_diff(a: StateSource, b: StateSource) -> dict[str, float]:
    """Mean absolute difference per parameter of two models (or checkpoints, state dicts), by name:
    the notes' ``model_diff(model1, model2)``. Models are compared by ``named_parameters()``.

    Raises:
        CheckpointError: a path is missing, corrupt or carries pickled code.
        ValueError: the two do not have the same parameter names and shapes.
    """
    diff = param_diff(_state(a, parameters_only=True), _state(b, parameters_only=True))
    if diff.only_in_a or diff.only_in_b or diff.shape_mismatch:
        raise ValueError(
            f"model_diff: the models differ in structure (only in the first: {diff.only_in_a[:3]}, only in the "
            f"second: {diff.only_in_b[:3]}, other shapes: {list(diff.shape_mismatch)[:3]})"
        )
    return {name: change["mean_abs"] for name, change in diff.changes.items()}


# ---- peak memory ------------------------------------------------------------------------------


def _rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; elsewhere the lifetime peak from getrusage)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class PeakMemory:
    """Context manager measuring peak memory of a block.

    On CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak. On CPU: the process RSS,
    sampled by a background thread every ``interval`` seconds and once more on exit.

    Attributes (after the block): ``peak_bytes`` (absolute peak), ``delta_bytes`` (peak minus the
    value at entry), ``kind`` (``cuda`` or ``rss``).
    """

    def __init__(self, device: str | torch.device = "cpu", interval: float = 0.005) -> None:
        self.device = torch.device(device)
        self.interval = interval
        self.kind = "cuda" if self.device.type == "cuda" else "rss"
        self.start_bytes = self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def delta_bytes(self) -> int:
        return self.peak_bytes - self.start_bytes

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_bytes = max(self.peak_bytes, _rss_bytes())

    def __enter__(self) -> PeakMemory:
        if self.kind == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = self.peak_bytes = torch.cuda.memory_allocated(self.device)
        else:
            self.start_bytes = self.peak_bytes = _rss_bytes()
            self._thread = threading.Thread(target=self._sample, name="edgedeploy-peak-rss", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.kind == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
            return
        self.peak_bytes = max(self.peak_bytes, _rss_bytes())
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> str:
        return f"peak {self.kind} {self.peak_bytes / 2**20:.1f} MiB (+{self.delta_bytes / 2**20:.1f} MiB in block)"


# ---- profiler ---------------------------------------------------------------------------------


def step_profiler(out_dir: str | Path, wait: int = 1, warmup: int = 1, active: int = 3) -> torch.profiler.profile:
    """A ``torch.profiler.profile`` that writes a Chrome trace (``trace_step<N>.json``) into ``out_dir``.

    Use as a context manager and call ``.step()`` once per training step; CUDA activity is recorded
    when a GPU is available. Open the trace in chrome://tracing or Perfetto.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def write(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(str(out / f"trace_step{prof.step_num}.json"))

    return torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=write,
        record_shapes=True,
    )


# ---- anomaly detection ------------------------------------------------------------------------


@contextlib.contextmanager
def anomaly_detection(enabled: bool = True, check_nan: bool = True) -> Iterator[None]:
    """Turn autograd anomaly detection on (or off) for a block and restore the previous setting.

    With it on, a backward that produces NaN raises ``RuntimeError`` naming the forward op at fault
    (slow: use it to debug, not to train).
    """
    previous = torch.is_anomaly_enabled()
    previous_nan = torch.is_anomaly_check_nan_enabled()
    torch.set_anomaly_enabled(enabled, check_nan)
    try:
        yield
    finally:
        torch.set_anomaly_enabled(previous, previous_nan)
