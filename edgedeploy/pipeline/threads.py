"""How the worker threads of PyTorch's OpenMP and numpy's OpenBLAS wait in a build's process: a short spin,
then asleep.

PyTorch's CPU kernels run on an OpenMP pool whose threads, by default, spin at the end of every parallel
region waiting for the others. A model of many small layers (EfficientNet's depthwise blocks: ~450 ops per
forward) ends hundreds of regions per forward; on a machine whose cores other jobs also use, a spinning
thread holds its core while the one it waits for is descheduled, and each forward costs seconds instead of
tens of milliseconds. Sleeping at once (``OMP_WAIT_POLICY=PASSIVE``) avoids that but pays a wake-up at every
region: on an idle machine it doubles a forward. A short spin (``GOMP_SPINCOUNT``, GNU OpenMP, which the
PyTorch wheels for Linux ship) keeps the idle speed and sleeps before it holds a busy core for long.

EfficientNet-Lite0's TorchScript forward at batch 1 on 2 cores, median (slowest) of 15, one run of
``bench/thread_waits.py --json bench/thread_waits.json``:

========================  ================  ===============================
policy                    idle machine      6 busy processes on the 2 cores
========================  ================  ===============================
spinning (default)        18 ms (24)        1138 ms (4444)
passive                   45 ms (51)        193 ms (221)
``GOMP_SPINCOUNT=10000``  20 ms (22)        134 ms (321)
========================  ================  ===============================

The OpenMP runtime reads these variables once, when it is loaded (with torch), so they are set before the
build imports torch, and only when the user has chosen neither.

numpy's OpenBLAS (the scipy-openblas the numpy wheels ship) keeps each worker thread spinning for 2**28 cycles
(about 0.1 s) after every threaded BLAS call. A build times ONNX Runtime between such calls (each INT8 try's
latency, the speed probe): on 2 cores the spinning worker holds one of ONNX Runtime's two, and an
EfficientNet-Lite0 INT8 try that runs in 2.3 ms was timed at 6.3-7.7 ms (p50 of 5 runs), slower than the FP32
model. ``OPENBLAS_THREAD_TIMEOUT=4`` (2**4 cycles, the least OpenBLAS takes) lets the worker sleep at once; the
matrix products themselves stay threaded. OpenBLAS reads it when numpy loads, so :func:`bounded_blas_waits`
runs before the command imports numpy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
SPIN_COUNT_ENV = "GOMP_SPINCOUNT"
SPIN_COUNT = "10000"  # spins before a GNU OpenMP thread sleeps: microseconds, not the default 300000
BLAS_TIMEOUT_ENV = "OPENBLAS_THREAD_TIMEOUT"
BLAS_TIMEOUT = "4"  # an OpenBLAS worker spins 2**4 cycles after a call, not the default 2**28 (about 0.1 s)


def bounded_thread_waits() -> str:
    """Set how this process's OpenMP threads wait, when nothing has chosen it yet; say what applies.

    Returns one of ``"short spin: GOMP_SPINCOUNT=10000"`` (set now: torch ships GNU OpenMP), ``"passive"``
    (``OMP_WAIT_POLICY=PASSIVE`` set now: another OpenMP runtime, or torch not found), ``"user: <NAME>=<value>"``
    (the environment already names a policy or a spin count, kept) or ``"unchanged: torch already loaded"``
    (too late: the OpenMP runtime has read its settings).
    """
    chosen = [f"{name}={os.environ[name]}" for name in (WAIT_POLICY_ENV, SPIN_COUNT_ENV) if name in os.environ]
    if chosen:
        return f"user: {', '.join(chosen)}"
    if "torch" in sys.modules:
        return "unchanged: torch already loaded"
    if torch_uses_gnu_openmp():
        os.environ[SPIN_COUNT_ENV] = SPIN_COUNT
        return f"short spin: {SPIN_COUNT_ENV}={SPIN_COUNT}"
    os.environ[WAIT_POLICY_ENV] = "PASSIVE"
    return "passive"


def bounded_blas_waits() -> str:
    """Set how long numpy's OpenBLAS worker threads spin after a call, when nothing has chosen it yet; say what
    applies.

    Returns one of ``"short spin: OPENBLAS_THREAD_TIMEOUT=4"`` (set now), ``"user: OPENBLAS_THREAD_TIMEOUT=<value>"``
    (kept) or ``"unchanged: numpy already loaded"`` (too late: OpenBLAS has read its settings).
    """
    if BLAS_TIMEOUT_ENV in os.environ:
        return f"user: {BLAS_TIMEOUT_ENV}={os.environ[BLAS_TIMEOUT_ENV]}"
    if "numpy" in sys.modules:
        return "unchanged: numpy already loaded"
    os.environ[BLAS_TIMEOUT_ENV] = BLAS_TIMEOUT
    return f"short spin: {BLAS_TIMEOUT_ENV}={BLAS_TIMEOUT}"


def torch_uses_gnu_openmp() -> bool:
    """Whether the installed torch ships GNU OpenMP (``libgomp``), found without importing torch."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    package = Path(next(iter(spec.submodule_search_locations)))
    return any(any(folder.glob("libgomp*.so*")) for folder in (package / "lib", package.parent / "torch.libs"))
