"""Attacks that were already held, kept held: names from a model never reach a shell, ``--out /etc`` is refused,
a pickled Hugging Face weights file runs nothing."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import edgedeploy
from edgedeploy.errors import InputError
from edgedeploy.trt.plan import BuildPlan, InputProfile
from edgedeploy.trt.trtexec import trtexec_script

REPO = Path(__file__).resolve().parents[2]


def test_trtexec_script_quotes_every_name_the_model_brings(tmp_path):
    """Input and layer names come from the ONNX file (the attacker's): the generated script runs none of them."""
    marker = tmp_path / "PWNED"
    hostile = (f"x$(touch {marker})", f"a;touch {marker}", f"`touch {marker}`", f"b' ; touch {marker}; '")
    plan = BuildPlan(
        target="jetson-orin",
        trt_version="10.3",
        sm="8.7",
        precision="fp32",
        strategy="fp32",
        onnx=f"model $(touch {marker}).onnx",
        strongly_typed=False,
        inputs=(InputProfile(hostile[0], (1, 4), (2, 4), (4, 4)),),
        workspace_mib=64,
        fp32_layers=hostile[1:],
        fp32_output_layers=hostile[1:],
    )
    script = tmp_path / "trtexec.sh"
    script.write_text(trtexec_script(plan))
    args = tmp_path / "args"
    env = dict(os.environ, TRTEXEC=f"{tmp_path / 'fake-trtexec'}")
    (tmp_path / "fake-trtexec").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {args}\n')
    (tmp_path / "fake-trtexec").chmod(0o755)
    proc = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    seen = args.read_text()
    assert all(name in seen for name in hostile)  # passed through as data, byte for byte


def test_out_etc_is_refused_and_left_alone(tiny_project: Path):
    before = sorted(p.name for p in Path("/etc").iterdir())
    lock = Path("/.etc.lock")
    had_lock = lock.exists()
    try:
        with pytest.raises(InputError, match="not an edgedeploy output folder"):
            edgedeploy.build(tiny_project, build__out="/etc", log=lambda _: None)
    finally:
        if not had_lock:
            lock.unlink(missing_ok=True)  # the build's own lock file beside /etc
    assert sorted(p.name for p in Path("/etc").iterdir()) == before
    assert not list(Path("/").glob(".etc.staging-*"))


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickled_hugging_face_weights_run_nothing(tmp_path):
    pytest.importorskip("transformers")
    sys.path.insert(0, str(REPO / "tests"))
    from hf_tiny import save_tiny

    folder = save_tiny("bert", tmp_path / "bert")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "PWNED"
    with open(folder / "pytorch_model.bin", "wb") as fh:
        pickle.dump({"bert.embeddings.word_embeddings.weight": _Payload(str(marker))}, fh)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "edgedeploy", "build", "--hf", str(folder), "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path, input="y\n")
    assert proc.returncode != 0 and not marker.exists(), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()  # nothing published (a failure report at most)
