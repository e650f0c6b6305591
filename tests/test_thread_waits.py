"""A build's process bounds how PyTorch's OpenMP threads wait, set before torch loads: a short spin where torch
ships GNU OpenMP, passive waits elsewhere; a user's choice of either variable is kept. Each case runs in a
fresh process (the settings are read once, at load)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edgedeploy.pipeline.threads import torch_uses_gnu_openmp

PROBE = """
import json, os, sys
{before}
from edgedeploy.pipeline.threads import bounded_thread_waits
said = bounded_thread_waits()
print(json.dumps({{"said": said, "policy": os.environ.get("OMP_WAIT_POLICY"),
                  "spin": os.environ.get("GOMP_SPINCOUNT")}}))
"""
NAMES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def _probe(before: str = "", **chosen: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in NAMES}
    env.update(chosen)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_waits_are_bounded_before_torch_loads() -> None:
    got = _probe()
    if torch_uses_gnu_openmp():  # the Linux wheels: a short spin, then asleep
        assert got == {"said": "short spin: GOMP_SPINCOUNT=10000", "policy": None, "spin": "10000"}
    else:
        assert got == {"said": "passive", "policy": "PASSIVE", "spin": None}


def test_gnu_openmp_is_told_from_the_torch_package_found_first(tmp_path) -> None:
    # a torch package found first on the path decides, and it is not imported (it would raise)
    check = (
        "from edgedeploy.pipeline.threads import torch_uses_gnu_openmp as f; import sys; "
        "print(f(), 'torch' in sys.modules)"
    )
    for ships, expected in ((True, "True False"), (False, "False False")):
        root = tmp_path / str(ships)
        (root / "torch" / "lib").mkdir(parents=True)
        (root / "torch" / "__init__.py").write_text("raise ImportError('imported')\n")
        if ships:
            (root / "torch" / "lib" / "libgomp-a34b3233.so.1").write_bytes(b"")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env, timeout=300)
        assert proc.stdout.split() == expected.split(), proc.stderr[-2000:]


def test_a_users_wait_policy_or_spin_count_is_kept() -> None:
    kept = {"said": "user: OMP_WAIT_POLICY=ACTIVE", "policy": "ACTIVE", "spin": None}
    assert _probe(OMP_WAIT_POLICY="ACTIVE") == kept
    assert _probe(GOMP_SPINCOUNT="5") == {"said": "user: GOMP_SPINCOUNT=5", "policy": None, "spin": "5"}


def test_nothing_is_set_once_torch_is_loaded() -> None:
    # the OpenMP runtime has read its settings: setting a variable now would only mislead whoever reads it
    assert _probe(before="import torch") == {"said": "unchanged: torch already loaded", "policy": None, "spin": None}


BLAS_PROBE = """
import json, os, sys, time
{before}
import numpy as np
a = np.random.default_rng(0).random((512, 512))
spun = []
for _ in range(3):
    a @ a  # a threaded BLAS call wakes OpenBLAS's workers
    t0 = time.process_time()
    time.sleep(0.3)  # this thread sleeps: what the process burns now is the workers' spinning
    spun.append(time.process_time() - t0)
print(json.dumps({{"spun_s": min(spun), "timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT")}}))
"""
CLI_FIRST = """
from edgedeploy.cli import main
try:
    main(["--version"])
except SystemExit:
    pass
"""


def _blas_probe(before: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    proc = subprocess.run(
        [sys.executable, "-c", BLAS_PROBE.format(before=before)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_deploy_command_keeps_numpys_blas_threads_from_spinning_after_a_call() -> None:
    # a spinning OpenBLAS worker holds one of 2 cores for about 0.1 s after each call: ONNX Runtime timed then
    # (each INT8 try's latency) ran up to 3x slower than the model does
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: OpenBLAS starts no worker thread")
    plain = _blas_probe()
    if plain["spun_s"] < 0.03:
        pytest.skip(f"this numpy's BLAS does not spin after a call ({plain['spun_s']:.3f} s)")
    bounded = _blas_probe(before=CLI_FIRST)
    assert bounded["timeout"] == "4"
    assert bounded["spun_s"] < 0.02, (plain, bounded)


def test_blas_waits_are_set_only_before_numpy_loads_and_a_users_choice_is_kept() -> None:
    probe = "from edgedeploy.pipeline.threads import bounded_blas_waits; import os; print(bounded_blas_waits())"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}

    def said(code: str, **chosen: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env={**env, **chosen}, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip().splitlines()[-1]

    assert said(probe) == "short spin: OPENBLAS_THREAD_TIMEOUT=4"
    assert said(probe, OPENBLAS_THREAD_TIMEOUT="20") == "user: OPENBLAS_THREAD_TIMEOUT=20"
    assert said("import numpy; " + probe) == "unchanged: numpy already loaded"
