"""A device bundle is data: files dropped into it never run, unlisted files are refused, names stay inside it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_unique_tiny_project

from edgedeploy.api import build
from edgedeploy.cli import main
from edgedeploy.device import complete_bundle as device
from edgedeploy.fileio.hashing import sha256_file

# one xdist worker runs this module, so its module-scoped build fixture runs once (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_bundle_hijack")

PAYLOAD = "import pathlib; pathlib.Path({marker!r}).write_text('pwned')\n"


@pytest.fixture(scope="module")
def built_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hijack-project")
    cfg = write_unique_tiny_project(folder)
    result = build(cfg, log=lambda _: None, build__target="jetson-orin")
    return result.out / "bundle"


@pytest.fixture
def bundle(built_bundle, tmp_path):
    dest = tmp_path / "bundle"
    shutil.copytree(built_bundle, dest)
    return dest


def run_script(bundle: Path, *args: str, python_flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run the bundle's own script the way the README says (plain ``python3 complete_bundle.py .``)."""
    cmd = [sys.executable, *python_flags, "complete_bundle.py", ".", "--runner", "onnxruntime", *args]
    return subprocess.run(cmd, cwd=bundle, capture_output=True, text=True, timeout=120)


def _relist(bundle: Path, *names: str) -> None:
    """Forge bundle.json so it lists ``names`` with their real hashes (an attacker without the pin)."""
    manifest = json.loads((bundle / "bundle.json").read_text())
    for n in names:
        manifest["files"][n] = sha256_file(bundle / n)
    (bundle / "bundle.json").write_text(json.dumps(manifest))


def test_the_untouched_bundle_still_passes_as_documented(bundle):
    pinned = sha256_file(bundle / "bundle.json")
    for flags in ((), ("-I",)):
        proc = run_script(bundle, "--bundle-sha256", pinned, python_flags=flags)
        assert proc.returncode == 0, proc.stderr
        assert "PASSED" in proc.stderr
    (bundle / "validation.json").unlink()  # the device step's own outputs are allowed beside the listed files


@pytest.mark.parametrize("module", ["argparse", "numpy", "hashlib", "json"])
def test_a_dropped_module_never_runs_and_the_unlisted_file_is_refused(bundle, tmp_path, module):
    marker = tmp_path / f"PWNED-{module}"
    (bundle / f"{module}.py").write_text(PAYLOAD.format(marker=str(marker)))
    proc = run_script(bundle, "--bundle-sha256", sha256_file(bundle / "bundle.json"))
    assert not marker.exists(), proc.stderr
    assert proc.returncode == device.EXIT_INTEGRITY, proc.stderr
    assert f"{module}.py is not listed in bundle.json" in proc.stderr


def test_a_module_listed_in_a_forged_manifest_is_still_never_imported(bundle, tmp_path):
    """Without the pin bundle.json can be forged; the script's folder still never reaches sys.path."""
    marker = tmp_path / "PWNED"
    for module in ("numpy", "onnxruntime"):
        (bundle / f"{module}.py").write_text(PAYLOAD.format(marker=str(marker)))
    _relist(bundle, "numpy.py", "onnxruntime.py")
    proc = run_script(bundle)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()


def test_deploy_bundle_verify_refuses_unlisted_files(bundle, capsys):
    assert main(["bundle", "verify", str(bundle)]) == 0
    (bundle / "argparse.py").write_text("raise SystemExit('pwned')\n")
    (bundle / "sub").mkdir()
    (bundle / "sub" / "x.bin").write_bytes(b"x")
    assert main(["bundle", "verify", str(bundle)]) == device.EXIT_INTEGRITY
    err = capsys.readouterr().err
    assert "argparse.py is not listed" in err
    assert "sub/x.bin is not listed" in err


def test_verifying_the_output_folder_instead_of_its_bundle_names_the_bundle(bundle, capsys):
    out = bundle.parent  # the bundle sits at <out>/bundle, as a build writes it
    assert main(["bundle", "verify", str(out)]) == 3
    err = capsys.readouterr().err
    assert f"pass the bundle folder: {bundle}" in err and "output folder" in err


@pytest.mark.parametrize("name", ["../outside.txt", "/etc/hostname", "a/../../x", "a\\..\\x", ""])
def test_bundle_json_names_are_confined_to_the_bundle(bundle, name):
    manifest = json.loads((bundle / "bundle.json").read_text())
    manifest["files"][name] = "0" * 64
    (bundle / "bundle.json").write_text(json.dumps(manifest))
    with pytest.raises(device.IntegrityFailed, match="not a plain relative name"):
        device.verify_bundle(str(bundle))


def test_a_listed_symlink_out_of_the_bundle_is_refused(bundle, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    (bundle / "link.txt").symlink_to(outside)
    _relist(bundle, "link.txt")
    with pytest.raises(device.IntegrityFailed, match="is a link"):
        device.verify_bundle(str(bundle))


@pytest.mark.parametrize("key", ["onnx", "calib_cache", "engine", "timing_cache"])
def test_plan_names_are_confined_too(bundle, key):
    plan = json.loads((bundle / "plan.json").read_text())
    plan[key] = "../../escape.onnx"
    (bundle / "plan.json").write_text(json.dumps(plan))
    _relist(bundle, "plan.json")
    proc = run_script(bundle)
    assert proc.returncode == device.EXIT_INTEGRITY, proc.stderr
    assert "not a plain relative name" in proc.stderr


def test_standalone_helpers_load_only_after_verification(bundle):
    """Run as the bundle's own copy, trt_adapter/parity come from verified bytes, never from sys.path."""
    code = (
        "import runpy, sys; sys.modules['edgedeploy'] = None; sys.argv = ['complete_bundle.py'];"
        "g = runpy.run_path('complete_bundle.py', run_name='bundle_script');"
        "err = g['IntegrityFailed']\n"
        "try:\n    g['sibling']('parity')\nexcept err as exc:\n    print('REFUSED', exc.message)\n"
        "g['verify_bundle']('.')\nprint('LOADED', g['sibling']('parity').__file__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=bundle, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "REFUSED parity.py: not a verified file of this bundle" in proc.stdout
    assert f"LOADED {bundle.resolve() / 'parity.py'}" in proc.stdout


def test_verify_only_checks_before_trtexec_sh_runs_bundle_content(bundle):
    proc = subprocess.run(
        [sys.executable, "-I", "complete_bundle.py", ".", "--verify-only"], cwd=bundle, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert not (bundle / "validation.json").exists()
    (bundle / "trtexec.sh").write_text("#!/bin/sh\ntouch PWNED\n")
    proc = subprocess.run(
        [sys.executable, "-I", "complete_bundle.py", ".", "--verify-only"], cwd=bundle, capture_output=True, text=True
    )
    assert proc.returncode == device.EXIT_INTEGRITY and "trtexec.sh sha256 differs" in proc.stderr


@pytest.mark.parametrize("pythonpath", [".", "{bundle}", "{elsewhere}"])
def test_pythonpath_never_brings_a_stray_module_in_before_verification(bundle, tmp_path, pythonpath):
    """``PYTHONPATH=. python3 complete_bundle.py . --verify-only``: the stray json.py does not run, whatever
    PYTHONPATH names (the current folder, the bundle, any other folder)."""
    import os

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    marker = tmp_path / "PWNED"
    for folder in (bundle, elsewhere):
        for module in ("json", "hashlib", "numpy"):
            (folder / f"{module}.py").write_text(PAYLOAD.format(marker=str(marker)))
    env = dict(os.environ, PYTHONPATH=pythonpath.format(bundle=bundle, elsewhere=elsewhere))
    cmd = [sys.executable, "complete_bundle.py", ".", "--verify-only"]
    proc = subprocess.run(cmd, cwd=bundle, env=env, capture_output=True, text=True, timeout=120)
    assert not marker.exists(), proc.stderr
    assert proc.returncode == device.EXIT_INTEGRITY and "json.py is not listed in bundle.json" in proc.stderr


def test_the_script_keeps_the_interpreters_own_folders(tmp_path):
    import site

    stdlib = next(p for p in sys.path if p.startswith(sys.base_prefix) and p.endswith(f"python3.{sys.version_info[1]}"))
    here = str(tmp_path / "bundle")
    path = ["", ".", here, str(tmp_path), stdlib, *site.getsitepackages(), "/opt/elsewhere", here + "/sub"]
    kept = device._system_path(path, f"/opt/elsewhere:{tmp_path}", str(tmp_path), here)
    assert kept == [stdlib, *site.getsitepackages()]


def test_a_pinned_manifest_is_read_once_from_a_regular_file(bundle, tmp_path):
    """The pin hashes the very bytes the script then parses, from a regular file: a FIFO named bundle.json that
    serves a forged manifest (whose forged parity.py would run) is refused with exit 9 and nothing run, and a
    FIFO without a pin is one line (exit 3) at once, not a hang; a FIFO plan.json is not waited on either."""
    import os
    import threading

    pin = sha256_file(bundle / "bundle.json")
    marker = tmp_path / "pwned"
    with open(bundle / "parity.py", "a") as fh:
        fh.write(PAYLOAD.format(marker=str(marker)))
    _relist(bundle, "parity.py")
    forged = (bundle / "bundle.json").read_bytes()
    (bundle / "bundle.json").unlink()
    os.mkfifo(bundle / "bundle.json")

    def serve() -> None:  # a writer feeding the forged manifest to whoever opens the FIFO
        for _ in range(4):
            try:
                fd = os.open(bundle / "bundle.json", os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader yet
                threading.Event().wait(0.05)
                continue
            with os.fdopen(fd, "wb") as fh:
                fh.write(forged)

    threading.Thread(target=serve, daemon=True).start()
    proc = run_script(bundle, "--bundle-sha256", pin)
    assert proc.returncode == 9 and "not the pinned bundle manifest" in proc.stderr
    assert not marker.exists()
    proc = run_script(bundle)
    assert proc.returncode == 3 and "not a regular file" in proc.stderr
    assert not marker.exists()


def test_a_fifo_plan_is_refused_not_waited_on(bundle):
    import os

    (bundle / "plan.json").unlink()
    os.mkfifo(bundle / "plan.json")
    proc = run_script(bundle, "--verify-only")
    assert proc.returncode == 9 and "plan.json missing" in proc.stderr


def test_a_bundle_whose_goldens_compare_nothing_fails_not_passes(bundle):
    """An empty goldens.npz (listed with its real hash, as a forger without the pin can): 0 checks is no
    evidence, so the device check fails (exit 7) instead of printing PASSED: 0 checks."""
    import numpy as np

    np.savez(bundle / "goldens.npz")
    _relist(bundle, "goldens.npz")
    proc = run_script(bundle)
    assert proc.returncode == 7 and "no golden was compared" in proc.stderr
    assert json.loads((bundle / "validation.json").read_text())["status"] == "failed"


def test_goldens_that_declare_more_than_a_golden_holds_are_refused_before_anything_is_allocated(bundle):
    """A goldens.npz member whose header declares 2 GiB (a deflated member of a few MB can), and a seeded input
    whose shape declares 10^12 values: one line and exit 3 each, from the headers, nothing allocated."""
    import zipfile

    import numpy as np

    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (536870912,), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with zipfile.ZipFile(bundle / "goldens.npz", "w") as zf:
        zf.writestr("opt/0/out/logits.npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
    _relist(bundle, "goldens.npz")
    proc = run_script(bundle)
    assert proc.returncode == 3 and "over 1073741824" in proc.stderr and "Traceback" not in proc.stderr
    spec = {"seed": 0, "shape": [100000, 100000, 100], "low": 0.0, "high": 1.0, "dtype": "float32"}
    np.savez(bundle / "goldens.npz", **{"opt/0/gen/image": np.array(json.dumps(spec))})
    _relist(bundle, "goldens.npz")
    proc = run_script(bundle)
    assert proc.returncode == 3 and "unreadable entry 'opt/0/gen/image'" in proc.stderr


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("validation", [1, 2], "'validation' is not an object"),
        ("dry_run", ["x"], "'dry_run' is not an object"),
        ("validation.outputs", "logits", "validation.outputs is not a list of output names"),
        ("validation.topk", "abc", "validation.topk is not a positive whole number"),
        ("validation.tolerance", {"atol": "big"}, "validation.tolerance is not an object of numbers"),
    ],
)
def test_bundle_json_fields_of_the_wrong_type_are_one_line_not_a_traceback(bundle, field, value, named):
    """A manifest edited without the pin (its files still match): each field the judge reads is typed first,
    so an edit is exit 3 naming it, never a traceback or a check that passes on nothing (outputs as a string)."""
    manifest = json.loads((bundle / "bundle.json").read_text())
    node, _, key = field.rpartition(".")
    (manifest[node] if node else manifest)[key] = value
    (bundle / "bundle.json").write_text(json.dumps(manifest))
    proc = run_script(bundle)
    assert proc.returncode == 3 and named in proc.stderr and "Traceback" not in proc.stderr


def test_a_golden_input_the_model_cannot_take_is_one_line(bundle):
    """A golden input of the wrong shape (listed with its real hash): ONNX Runtime's error, in one line."""
    import numpy as np

    with np.load(bundle / "goldens.npz") as data:
        arrays = {k: data[k] for k in data.files}
    key = next(k for k in arrays if k.split("/")[2] == "in")
    arrays[key] = np.zeros((1, 7), np.float32)
    np.savez(bundle / "goldens.npz", **arrays)
    _relist(bundle, "goldens.npz")
    proc = run_script(bundle)
    assert proc.returncode == 6 and "running the model failed" in proc.stderr and "Traceback" not in proc.stderr


def test_files_are_used_as_they_were_verified_not_reopened_after(bundle):
    """After verification the plan and the goldens are read once and hashed as read: a file swapped between the
    check and its use (a writer racing the device step) is refused, not used."""
    device.verify_bundle(str(bundle))
    assert device.verified_bytes("goldens.npz") == (bundle / "goldens.npz").read_bytes()
    (bundle / "goldens.npz").write_bytes((bundle / "goldens.npz").read_bytes() + b"\0")
    with pytest.raises(device.IntegrityFailed, match="changed after the bundle was verified"):
        device.verified_bytes("goldens.npz", "judge with it")
    with pytest.raises(device.IntegrityFailed, match="not a verified file of this bundle"):
        device.verified_bytes("nothing.npz")


def test_the_dry_run_loads_the_model_as_verified_not_reopened_after(bundle, monkeypatch, capsys):
    """ONNX Runtime opens the model by name: the dry run hands it a private copy made from the verified bytes,
    so a model swapped into the bundle as the session opens is never loaded, and one swapped before the copy is
    refused."""
    plan = json.loads((bundle / "plan.json").read_text())
    manifest = json.loads((bundle / "bundle.json").read_text())
    model = bundle / ((manifest.get("dry_run") or {}).get("onnx") or plan["onnx"])
    verified = model.read_bytes()
    runner = device.OrtRunner.__init__

    def swap_then_open(self, *args, **kwargs):  # a writer racing the device step, as the session opens
        model.write_bytes(b"not the verified model")
        runner(self, *args, **kwargs)

    monkeypatch.setattr(device.OrtRunner, "__init__", swap_then_open)
    assert device.main([str(bundle), "--runner", "onnxruntime"]) == 0, capsys.readouterr().err
    assert model.read_bytes() == b"not the verified model"  # the swap happened; what ran was the verified copy
    model.write_bytes(verified)
    verify = device.verify_bundle

    def verify_then_swap(*args, **kwargs):  # swapped between the check and the copy: refused
        checked = verify(*args, **kwargs)
        model.write_bytes(b"not the verified model")
        return checked

    monkeypatch.setattr(device, "verify_bundle", verify_then_swap)
    assert device.main([str(bundle), "--runner", "onnxruntime"]) == device.EXIT_INTEGRITY
    assert "changed after the bundle was verified" in capsys.readouterr().err
