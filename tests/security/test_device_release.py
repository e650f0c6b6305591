"""A device-completed release: signed again after the device step, its device outputs are what the gate judges.

The device step runs the bundle's own ``complete_bundle.py`` in a process without torch or edgedeploy,
on the fake TensorRT 10.3 of ``tests/trt_fakes.py`` (the "engine" is the ONNX model run by ONNX Runtime).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import TINY_TOML, write_tiny_project

import edgedeploy
from edgedeploy.cli import main

pytestmark = pytest.mark.xdist_group("test_device_release")

TESTS = Path(__file__).resolve().parents[1]
DEVICE = """
import runpy, sys
sys.path.insert(0, {tests!r})
from trt_fakes import FakeLibCuda, make_tensorrt
import ctypes
lib = FakeLibCuda(name="Fake Orin", sm="8.7")
trt = make_tensorrt("10.3", lib)
sys.modules["tensorrt"] = trt
real_cdll = ctypes.CDLL
ctypes.CDLL = lambda name, *a, **k: lib if "libcuda" in str(name) else real_cdll(name, *a, **k)
for blocked in ("torch", "edgedeploy", "polygraphy"):
    sys.modules[blocked] = None
sys.argv = [{script!r}, {bundle!r}, "--latency-iters", "1"]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    caches = [c._cache for c in trt._state.configs if getattr(c, "_cache", None) is not None]
    print("timing cache read:", repr(caches[-1]._data if caches else None))
"""
POLICY = '[gate]\nrequired_checks = ["integrity"]\n'  # parity is judged on the device (validation.json)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(an orin release folder, the key prefix) built and signed once; tests work on copies."""
    folder = tmp_path_factory.mktemp("device-release")
    name = f"tinynet_{uuid.uuid4().hex[:8]}"
    cfg = write_tiny_project(folder, toml=TINY_TOML.replace("tinynet:build", f"{name}:build"))
    (folder / "tinynet.py").rename(folder / f"{name}.py")
    edgedeploy.build(cfg, log=lambda _: None, build__target="jetson-orin")
    assert main(["sign", "--generate-key", str(folder / "release")]) == 0
    return folder / "out", folder / "release"


@pytest.fixture
def release(built, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(built[0], out)
    (tmp_path / "gate.toml").write_text(POLICY)
    return out


def _device_step(bundle: Path) -> subprocess.CompletedProcess:
    code = DEVICE.format(tests=str(TESTS), script=str(bundle / "complete_bundle.py"), bundle=str(bundle))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _gate(out: Path, capsys, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["gate", str(out), "--policy", str(out.parent / "gate.toml"), *extra])
    got = capsys.readouterr()
    return code, got.out + got.err


def test_an_honest_device_completed_release_passes_after_signing_again(built, release, capsys):
    key, pub = f"{built[1]}.key", f"{built[1]}.pub"
    assert main(["sign", str(release), "--key", key]) == 0
    _device_step(release / "bundle")
    assert (release / "bundle" / "model.engine").is_file() and (release / "bundle" / "validation.json").is_file()
    code, text = _gate(release, capsys, "--verify-key", pub)  # signed before the device step: not covered
    assert code == 9 and "added since signing" in text and "deploy sign" in text, text
    assert main(["sign", str(release), "--key", key]) == 0  # the documented step: sign again after the device
    code, text = _gate(release, capsys, "--verify-key", pub)
    assert code == 0, text
    capsys.readouterr()
    assert main(["gate", str(release), "--policy", str(release.parent / "gate.toml"), "--json"]) == 0
    device = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["id"] == "device")
    assert device["passed"] and "validated on the device (TensorRT 10.3" in device["message"]


@pytest.mark.parametrize("forged", ["validation.json", "engine.json", "model.engine"])
def test_forged_device_outputs_fail_the_gate(built, release, capsys, forged):
    key, pub = f"{built[1]}.key", f"{built[1]}.pub"
    _device_step(release / "bundle")
    assert main(["sign", str(release), "--key", key]) == 0
    target = release / "bundle" / forged
    if forged == "model.engine":
        target.write_bytes(target.read_bytes() + b"\0backdoor")
    else:
        data = json.loads(target.read_text())
        record = data if forged == "engine.json" else data["engine"]
        record["engine_sha256"] = "0" * 64  # points at another engine
        target.write_text(json.dumps(data))
    code, text = _gate(release, capsys, "--verify-key", pub)
    assert code == 9 and f"bundle/{forged}" in text, text
    code, text = _gate(release, capsys)  # without a key: the device outputs must at least agree
    assert code == 9 and "device" in text, text
    assert "release.sig not checked" in text


def test_a_failed_device_validation_fails_the_gate(release, capsys):
    _device_step(release / "bundle")
    validation = release / "bundle" / "validation.json"
    data = json.loads(validation.read_text())
    data["status"] = "failed"
    validation.write_text(json.dumps(data))
    code, text = _gate(release, capsys)
    assert code == 7 and "device validation did not pass" in text, text


def test_an_unlisted_timing_cache_is_never_read_by_the_engine_build(release):
    bundle = release / "bundle"
    (bundle / "timing.cache").write_bytes(b"PLANTED timing cache")
    proc = _device_step(bundle)
    assert "timing cache read: b''" in proc.stdout, proc.stdout
    assert (bundle / "timing.cache").read_bytes() != b"PLANTED timing cache"


def test_a_private_key_readable_by_others_is_refused(built, release, tmp_path, capsys):
    key = tmp_path / "leaky.key"
    shutil.copy(f"{built[1]}.key", key)
    key.chmod(0o644)
    capsys.readouterr()
    assert main(["sign", str(release), "--key", str(key)]) == 3
    err = capsys.readouterr().err
    assert "readable by others" in err and "Traceback" not in err
    assert not (release / "release.sig").exists()


def test_generate_key_into_a_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    """A missing folder is created (tests/test_cli_flags.py); one that cannot be (a file in the way) is one line."""
    (tmp_path / "no").write_text("a file, not a folder")
    assert main(["sign", "--generate-key", str(tmp_path / "no" / "such" / "release")]) == 3
    err = capsys.readouterr().err
    assert "cannot write the key pair" in err and "Traceback" not in err and err.count("\n") <= 2


def test_completing_a_signed_bundle_says_to_sign_again(built, release, capsys):
    assert main(["sign", str(release), "--key", f"{built[1]}.key"]) == 0
    capsys.readouterr()
    assert main(["bundle", "complete", str(release / "bundle"), "--runner", "onnxruntime"]) == 0
    assert f"sign again (deploy sign {release.resolve()} --key KEY)" in capsys.readouterr().err
