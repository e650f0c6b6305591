"""How PyTorch's OpenMP threads wait in a build's process: asleep, not spinning.

PyTorch's CPU kernels run on an OpenMP pool whose threads, by default, spin at the end of every parallel
region waiting for the others. A model of many small layers (EfficientNet's depthwise blocks: ~450 ops per
forward) ends hundreds of regions per forward; on a machine whose cores other jobs also use, a spinning
thread holds its core while the one it waits for is descheduled, and each forward costs seconds instead of
tens of milliseconds (bench/README.md, "Where a cold build's time goes": 0.6-5.2 s against 0.03-0.11 s per
EfficientNet-Lite0 forward at batch 1, load 8, 2 cores). Passive waiting costs a wake-up per region instead, which
is small beside a layer. The OpenMP runtime reads ``OMP_WAIT_POLICY`` once, when it is loaded (with torch),
so it is set before the build imports torch, and only when the user has not chosen a policy.
"""

from __future__ import annotations

import os
import sys

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


def passive_thread_waits() -> str:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this process when nothing has chosen it yet; say what applies.

    Returns one of ``"passive"`` (set now), ``"user: <value>"`` (the environment already names a policy,
    kept) or ``"unchanged: torch already loaded"`` (too late: the OpenMP runtime has read its settings).
    """
    chosen = os.environ.get(WAIT_POLICY_ENV)
    if chosen is not None:
        return f"user: {chosen}"
    if "torch" in sys.modules:
        return "unchanged: torch already loaded"
    os.environ[WAIT_POLICY_ENV] = "PASSIVE"
    return "passive"
