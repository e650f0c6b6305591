"""A build's process runs PyTorch's OpenMP threads with passive waits, set before torch loads; a user's
choice of ``OMP_WAIT_POLICY`` is kept. Each case runs in a fresh process (the policy is read once, at load)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json, os, sys
{before}
from edgedeploy.pipeline.threads import passive_thread_waits
said = passive_thread_waits()
print(json.dumps({{"said": said, "env": os.environ.get("OMP_WAIT_POLICY")}}))
"""


def _probe(before: str = "", policy: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_passive_waits_are_set_before_torch_loads() -> None:
    assert _probe() == {"said": "passive", "env": "PASSIVE"}


def test_a_users_wait_policy_is_kept() -> None:
    assert _probe(policy="ACTIVE") == {"said": "user: ACTIVE", "env": "ACTIVE"}


def test_nothing_is_set_once_torch_is_loaded() -> None:
    # the OpenMP runtime has read its settings: setting the variable now would only mislead whoever reads it
    assert _probe(before="import torch") == {"said": "unchanged: torch already loaded", "env": None}
