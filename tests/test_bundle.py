"""Device bundles: written by ``deploy build --target jetson-orin`` here, completed by the bundled script.

The device step runs as a subprocess from the bundle's own copy of ``complete_bundle.py``, with torch and
edgedeploy made unimportable, and ONNX Runtime standing in for the engine (``--runner onnxruntime``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import write_unique_tiny_project

from edgedeploy.api import build
from edgedeploy.cli import main
from edgedeploy.device import complete_bundle as device
from edgedeploy.modelio.goldens import load_goldens
from edgedeploy.stages.build_trt import pinned_command
from edgedeploy.trt import adapter

# one xdist worker runs this module, so its module-scoped build fixture runs once (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_bundle")

# run the bundled script the way a device would: no torch, no edgedeploy
RUN_ISOLATED = (
    "import runpy, sys; sys.modules['torch'] = None; sys.modules['edgedeploy'] = None; "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.fixture(scope="module")
def orin_build(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundle-project")
    cfg = write_unique_tiny_project(folder)
    lines: list[str] = []
    result = build(cfg, log=lines.append, build__target="jetson-orin")
    return cfg, result, lines


@pytest.fixture
def bundle(orin_build, tmp_path):
    """A private copy of the built bundle (as if copied to the device)."""
    _, result, _ = orin_build
    dest = tmp_path / "bundle"
    shutil.copytree(result.out / "bundle", dest)
    return dest


def run_device(bundle: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", RUN_ISOLATED, str(bundle / "complete_bundle.py"), str(bundle), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_build_writes_a_complete_bundle_and_builds_no_engine(orin_build):
    _, result, lines = orin_build
    folder = result.out / "bundle"
    names = {p.name for p in folder.iterdir()}
    expected = {
        "model.onnx",
        "goldens.npz",
        "plan.json",
        "trtexec.sh",
        "complete_bundle.py",
        "trt_adapter.py",
        "trt_runner.py",
    }
    assert expected | {"parity.py", "goldens_format.py", "README.txt", "bundle.json"} == names
    manifest = json.loads((folder / "bundle.json").read_text())
    assert set(manifest["files"]) == names - {"bundle.json"}
    assert manifest["target"]["name"] == "jetson-orin" and manifest["validation"]["outputs"] == ["logits"]
    assert device.verify_bundle(str(folder)) == manifest
    assert not list(result.out.rglob("*.engine")) and not list(result.out.rglob("engine.json"))
    plan = json.loads((folder / "plan.json").read_text())
    assert (plan["strategy"], plan["onnx"], plan["sm"], plan["trt_version"]) == ("fp32", "model.onnx", "8.7", "10.3")
    assert [i["min"][0] for i in plan["inputs"]] == [1] and [i["max"][0] for i in plan["inputs"]] == [4]
    assert "--saveEngine=model.engine" in (folder / "trtexec.sh").read_text()
    # every bundle file is also in the build's manifest, hashed
    assert {f"bundle/{n}" for n in names} <= set(json.loads((result.out / "manifest.json").read_text())["artifacts"])


def test_build_says_plainly_the_engine_is_built_on_the_device(orin_build, tmp_path):
    _, result, lines = orin_build
    report = result.report
    assert report["parity"]["status"] == "skipped"
    assert "engine built on device" in report["parity"]["reason"]
    validate = next(s for s in report["stages"] if s["name"] == "validate")
    assert validate["status"] == "skipped" and "engine built on device" in validate["reason"]
    (note,) = [n for n in report["notes"] if "engine not built here" in n]
    # the command checks the script before the script checks the rest: a changed script fails sha256sum -c
    build = report["metrics"]["build"]
    script_sha, bundle_sha = build["complete_bundle_sha256"], build["bundle_sha256"]
    assert note.endswith(pinned_command(script_sha, bundle_sha)) and script_sha in note
    folder = result.out / "bundle"
    assert hashlib.sha256((folder / "complete_bundle.py").read_bytes()).hexdigest() == script_sha
    check = f'echo "{script_sha}  complete_bundle.py" | sha256sum -c -'
    assert subprocess.run(check, shell=True, cwd=folder, capture_output=True).returncode == 0
    tampered = tmp_path / "tampered"
    shutil.copytree(folder, tampered)
    (tampered / "complete_bundle.py").write_text((folder / "complete_bundle.py").read_text() + "\n# changed\n")
    assert subprocess.run(check, shell=True, cwd=tampered, capture_output=True).returncode != 0
    # said once: deploy build prints the report's notes at the end, not again among the stage lines
    assert not any("engine not built here" in line for line in lines)
    assert report["metrics"]["build"]["engine"].startswith("not built here")


def test_device_step_passes_against_the_goldens_with_the_onnxruntime_stand_in(bundle):
    proc = run_device(bundle, "--runner", "onnxruntime")
    assert proc.returncode == 0, proc.stderr
    assert "bundle verified" in proc.stderr and "PASSED" in proc.stderr
    validation = json.loads((bundle / "validation.json").read_text())
    assert validation["status"] == "passed" and validation["runner"].startswith("onnxruntime (stand-in")
    assert len(validation["checks"]) == 3  # min / opt / max, one sample each, one output
    assert all(c["passed"] and c["max_abs"] < 1e-4 for c in validation["checks"])
    assert not (bundle / "model.engine").exists() and not (bundle / "engine.json").exists()


@pytest.mark.parametrize("victim", ["model.onnx", "goldens.npz", "trt_adapter.py"])
def test_tampered_file_fails_loudly_before_anything_runs(bundle, victim):
    with open(bundle / victim, "ab") as fh:
        fh.write(b"\0")
    proc = run_device(bundle, "--runner", "onnxruntime")
    assert proc.returncode == 9
    assert f"{victim} sha256 differs from bundle.json (tampered or replaced)" in proc.stderr
    assert not (bundle / "validation.json").exists()


def test_pinned_bundle_manifest_hash_is_checked(bundle, orin_build):
    _, result, _ = orin_build
    good = result.report["metrics"]["build"]["bundle_sha256"]
    assert run_device(bundle, "--runner", "onnxruntime", "--bundle-sha256", good).returncode == 0
    proc = run_device(bundle, "--runner", "onnxruntime", "--bundle-sha256", "0" * 64)
    assert proc.returncode == 9 and "bundle.json: sha256" in proc.stderr


def test_outputs_that_disagree_with_the_goldens_fail_with_exit_7(bundle):
    with np.load(bundle / "goldens.npz") as data:
        arrays = {k: data[k] + (0.5 if "/out/" in k else 0) for k in data.files}
    np.savez(bundle / "goldens.npz", **arrays)
    manifest = json.loads((bundle / "bundle.json").read_text())
    manifest["files"]["goldens.npz"] = device.sha256_file(str(bundle / "goldens.npz"))
    (bundle / "bundle.json").write_text(json.dumps(manifest))
    proc = run_device(bundle, "--runner", "onnxruntime")
    assert proc.returncode == 7
    assert "3 of 3 checks against the PyTorch goldens failed" in proc.stderr
    assert json.loads((bundle / "validation.json").read_text())["status"] == "failed"


@pytest.mark.skipif(adapter.tensorrt_version() is not None, reason="checks the message where TensorRT is absent")
def test_tensorrt_runner_without_tensorrt_points_to_the_device(bundle):
    proc = run_device(bundle)
    assert proc.returncode == 6
    assert "TensorRT's Python bindings do not import here" in proc.stderr and "run this on the device" in proc.stderr


def test_goldens_round_trip_device_reader_matches_the_reference_stage(bundle):
    ours = device.load_goldens(str(bundle / "goldens.npz"))
    theirs = load_goldens(bundle / "goldens.npz")
    assert ours.keys() == theirs.keys() == {"min", "opt", "max"}
    for point in ours:
        for s, pair in ours[point].items():
            for kind in ("in", "out"):
                assert pair[kind].keys() == theirs[point][s][kind].keys()
                for name, arr in pair[kind].items():
                    np.testing.assert_array_equal(arr, theirs[point][s][kind][name])


def test_deploy_bundle_commands_wrap_the_device_step(bundle, capsys):
    assert main(["bundle", "verify", str(bundle)]) == 0
    assert main(["bundle", "complete", str(bundle), "--runner", "onnxruntime"]) == 0
    (bundle / "plan.json").write_text("{}")
    assert main(["bundle", "verify", str(bundle)]) == 9
    assert "plan.json sha256 differs" in capsys.readouterr().err


def test_rebuild_reuses_the_cached_bundle_byte_for_byte(orin_build):
    cfg, result, _ = orin_build
    again = build(cfg, log=lambda s: None, build__target="jetson-orin")
    assert next(s for s in again.stages if s.name == "build").status == "cached"
    assert again.report["metrics"]["build"]["bundle_sha256"] == result.report["metrics"]["build"]["bundle_sha256"]


def test_int8_bundle_carries_the_precision_stages_int8_route(orin_build, tmp_path, monkeypatch):
    cfg, result, _ = orin_build
    rng = np.random.default_rng(0)
    calib = tmp_path / "calib.npy"
    np.save(calib, rng.uniform(-1, 1, size=(8, 3, 16, 16)).astype(np.float32))
    out = tmp_path / "out8"
    r8 = build(
        cfg,
        log=lambda s: None,
        build__target="jetson-orin",
        build__out=str(out),
        precision__mode="int8",
        precision__calib=str(calib),
    )
    plan = json.loads((out / "bundle" / "plan.json").read_text())
    # TensorRT 10.3: explicit Q/DQ only, no calibration cache anywhere
    assert (plan["precision"], plan["strategy"], plan["calib_cache"]) == ("int8", "int8-qdq", None)
    script = (out / "bundle" / "trtexec.sh").read_text()
    assert "--int8" in script and f"--onnx={plan['onnx']}" in script and "--calib" not in script
    assert not (out / "bundle" / "calib.cache").exists() and not (out / "calib.cache").exists()
    import onnx

    from edgedeploy.precision.qdq_placement import placement_findings

    findings = placement_findings(onnx.load(str(out / "bundle" / plan["onnx"])))
    assert findings == {"conv_activation_qdq": [], "add_both_quantized": [], "add_skip_float": []}
    assert (out / "bundle" / "precision.json").is_file()
    assert r8.report["metrics"]["build"]["plan"]["strategy"] == plan["strategy"]
    proc = run_device(out / "bundle", "--runner", "onnxruntime")
    assert proc.returncode == 0, proc.stderr


def test_a_cached_bundle_note_names_no_other_builds_folder(orin_build, tmp_path):
    cfg, first, _ = orin_build
    again = build(cfg, log=lambda _l: None, build__target="jetson-orin", build__out=str(tmp_path / "elsewhere"))
    (note,) = [n for n in again.report["notes"] if "engine not built here" in n]
    assert "cached" in " ".join(s["status"] for s in again.report["stages"])  # the build stage was replayed
    assert str(first.out) not in note and "Copy this build's bundle/ folder there" in note
