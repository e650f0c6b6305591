""".ci/containers, the container build-and-smoke job: a failing step fails the job and is named.

The job needs podman, buildah and debootstrap (it apt-get installs them as root), so these tests run under the
``slow`` marker and only as root on Linux. The broken step comes first in the Dockerfile, so the failing run
costs the base image only (a debootstrap the first time, then nothing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "containers"


def test_script_is_valid_bash():
    res = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


CAN_BUILD = (
    sys.platform.startswith("linux") and os.geteuid() == 0 and bool(shutil.which("podman") or shutil.which("apt-get"))
)
needs_root_linux = pytest.mark.skipif(
    not CAN_BUILD,
    reason="builds with podman: Linux, root, podman or apt-get to install it",
)


@pytest.mark.slow
@needs_root_linux
def test_a_broken_run_step_fails_the_job_naming_the_step(tmp_path: Path):
    env = dict(os.environ, EDGEDEPLOY_CONTAINERS_BREAK="1", CONTAINER_IMAGES="cpu")
    res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=1800, cwd=ROOT, env=env)
    assert res.returncode != 0, res.stdout[-2000:]
    failed = [line for line in res.stderr.splitlines() if line.startswith("FAILED: ")]
    assert len(failed) == 1, res.stderr[-3000:]
    assert "cpu image build" in failed[0]
    assert 'RUN echo "deliberately broken step"' in failed[0], failed[0]
    assert "image size:" not in res.stdout
