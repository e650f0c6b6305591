"""The gate binds manifest, report and model together, and a signed release fails on any change."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_TOML, write_tiny_project

from edgedeploy.cli import main
from edgedeploy.fileio.hashing import sha256_file

# one xdist worker runs this module, so its module-scoped build fixture runs once (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_signed_release")

INTEGRITY = 9


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[Path, Path, Path, Path]:
    """(project deploy.toml, signed output folder, private key, public key); a second seed's model too."""
    folder = tmp_path_factory.mktemp("signed")
    name = f"tinynet_{uuid.uuid4().hex[:8]}"
    cfg = write_tiny_project(folder, toml=TINY_TOML.replace("tinynet:build", f"{name}:build"))
    (folder / "tinynet.py").rename(folder / f"{name}.py")
    assert main(["build", "--config", str(cfg)]) == 0
    assert main(["sign", "--generate-key", str(folder / "release")]) == 0
    key, pub = folder / "release.key", folder / "release.pub"
    assert main(["sign", str(folder / "out"), "--key", str(key)]) == 0
    return cfg, folder / "out", key, pub


@pytest.fixture
def out(release, tmp_path) -> Path:
    dst = tmp_path / "out"
    shutil.copytree(release[1], dst, ignore=shutil.ignore_patterns(".cache"))
    return dst


def _gate(capsys, folder: Path, *args: str) -> tuple[int, str]:
    code = main(["gate", str(folder), *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _rehash(folder: Path, edit_manifest=None) -> None:
    """Recompute every hash in manifest.json after tampering (what an attacker with write access does)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["artifacts"] = {n: sha256_file(folder / n) for n in manifest["artifacts"] if (folder / n).is_file()}
    if edit_manifest:
        edit_manifest(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _edit_report(folder: Path, edit) -> None:
    report: dict[str, Any] = json.loads((folder / "report.json").read_text())
    edit(report)
    (folder / "report.json").write_text(json.dumps(report))


def test_the_keys_are_a_real_pair_with_a_private_mode(release):
    _, _, key, pub = release
    assert oct(os.stat(key).st_mode & 0o777) == "0o600"
    assert b"BEGIN PRIVATE KEY" in key.read_bytes() and b"BEGIN PUBLIC KEY" in pub.read_bytes()


def test_a_signed_untouched_release_passes(out, release, capsys):
    code, text = _gate(capsys, out, "--verify-key", str(release[3]))
    assert code == 0, text
    assert "gate passed" in text


def test_the_report_records_the_sha256_of_the_model_it_validated(out):
    report = json.loads((out / "report.json").read_text())
    model = report["model"]
    assert model["artifact"] == "model.onnx" and model["validated"] == "passed"
    assert model["sha256"] == sha256_file(out / "model.onnx")
    cand = next(c for c in report["parity"]["candidates"] if c["artifact"] == "model.onnx")
    assert cand["sha256"] == model["sha256"]


def test_a_failed_report_edited_to_passed_with_recomputed_hashes_fails_the_signature(out, release, capsys):
    def forge(report):
        report["status"] = "failed"
        report["error"] = {"kind": "parity failure", "exit_code": 7, "message": "max_abs 3.2"}

    _edit_report(out, forge)
    _rehash(out)
    assert _gate(capsys, out)[0] != 0  # the honest failed report fails

    def to_passed(report):
        report["status"] = "passed"
        report.pop("error")

    _edit_report(out, to_passed)
    _rehash(out)
    assert _gate(capsys, out)[0] == 0  # consistent forgery: only a signature can tell
    code, text = _gate(capsys, out, "--verify-key", str(release[3]))
    assert code == INTEGRITY, text
    assert "signature check failed" in text and "report.json" in text


def test_a_swapped_model_fails_with_and_without_a_key(out, release, tmp_path, capsys):
    other = tmp_path / "other"
    write_tiny_project(other, seed=7)
    (out / "model.onnx").write_bytes((other / "tiny.safetensors").read_bytes())  # another real model file
    assert _gate(capsys, out)[0] == INTEGRITY  # hash differs from the manifest
    _rehash(out)
    code, text = _gate(capsys, out)
    assert code == INTEGRITY and "swapped" in text, text
    code, text = _gate(capsys, out, "--verify-key", str(release[3]))
    assert code == INTEGRITY and "signature check failed" in text


def test_an_emptied_artifacts_map_fails(out, release, capsys):
    _rehash(out, lambda m: m.update(artifacts={}))
    code, text = _gate(capsys, out)
    assert code == INTEGRITY and "lists no artifacts" in text, text
    assert _gate(capsys, out, "--verify-key", str(release[3]))[0] == INTEGRITY


def test_a_release_with_no_model_fails(out, release, capsys):
    (out / "model.onnx").unlink()
    _rehash(out)
    code, text = _gate(capsys, out)
    assert code == INTEGRITY and "model.onnx is not in manifest.json" in text, text
    _edit_report(out, lambda r: r.pop("model"))
    _rehash(out, lambda m: m)
    code, text = _gate(capsys, out)
    assert code == INTEGRITY and "names no model" in text, text
    assert _gate(capsys, out, "--verify-key", str(release[3]))[0] == INTEGRITY


def test_an_added_file_or_a_removed_signature_fails_verification(out, release, capsys):
    (out / "sitecustomize.py").write_text("print('hi')\n")
    code, text = _gate(capsys, out, "--verify-key", str(release[3]))
    assert code == INTEGRITY and "sitecustomize.py" in text, text
    (out / "sitecustomize.py").unlink()
    (out / "release.sig").unlink()
    code, text = _gate(capsys, out, "--verify-key", str(release[3]))
    assert code == INTEGRITY and "not signed" in text


def test_a_signature_by_another_key_fails(out, release, tmp_path, capsys):
    assert main(["sign", "--generate-key", str(tmp_path / "mallory")]) == 0
    assert main(["sign", str(out), "--key", str(tmp_path / "mallory.key")]) == 0
    assert _gate(capsys, out, "--verify-key", str(tmp_path / "mallory.pub"))[0] == 0
    code, text = _gate(capsys, out, "--verify-key", str(release[3]))
    assert code == INTEGRITY and "signature check failed" in text


def test_deploy_sign_refuses_a_tampered_release(out, release, capsys):
    (out / "model.onnx").write_bytes(b"not the model")
    assert main(["sign", str(out), "--key", str(release[2])]) == INTEGRITY
    assert "model.onnx sha256 differs" in capsys.readouterr().err


def test_a_manifest_that_is_a_json_list_is_one_line_not_a_traceback(out, capsys):
    (out / "manifest.json").write_text("[1, 2]")
    code, text = _gate(capsys, out)
    assert code == INTEGRITY and "no readable manifest.json" in text


def test_a_signed_release_can_be_rebuilt_over(release, out):
    cfg = release[0]
    assert (out / "release.sig").is_file()
    assert main(["build", "--config", str(cfg), "--out", str(out)]) == 0
    assert not (out / "release.sig").exists()  # the new release is not signed until 'deploy sign' runs again


def test_signing_a_relative_path_covers_the_release_and_not_its_cache(release, tmp_path, monkeypatch, capsys):
    cfg, _, key, pub = release
    monkeypatch.chdir(tmp_path)  # the module's release stays as the fixture made it
    assert main(["build", "--config", str(cfg), "--out", "out"]) == 0
    assert main(["sign", "out", "--key", str(key)]) == 0
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat("out/release.sig").st_mode & 0o777 == 0o666 & ~mask  # like every artifact, not mkstemp's 0600
    (Path("out") / ".cache").mkdir(exist_ok=True)  # a cache folder inside OUT (EDGEDEPLOY_CACHE_DIR=out/.cache)
    (Path("out") / ".cache" / "later-entry").write_text("the cache may change after signing")
    code, text = _gate(capsys, Path("out"), "--verify-key", str(pub))
    assert code == 0, text


def test_a_bundle_release_binds_bundle_json_to_every_bundle_file(release, tmp_path, capsys):
    cfg = release[0]
    out = tmp_path / "orin"
    assert main(["build", "--config", str(cfg), "--target", "jetson-orin", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["artifact"] == "bundle/bundle.json" and report["model"]["validated"] == "on the device"
    policy = tmp_path / "bundle-gate.toml"  # as in release.yml: parity is checked on the device
    policy.write_text('[gate]\nrequired_checks = ["integrity"]\n')
    code, text = _gate(capsys, out, "--policy", str(policy))
    assert code == 0, text
    (out / "bundle" / "model.onnx").write_bytes(b"another model")
    _rehash(out)  # the manifest agrees with the swap; bundle.json (bound to the report) does not
    code, text = _gate(capsys, out, "--policy", str(policy))
    assert code == INTEGRITY and "model.onnx sha256 differs from bundle.json" in text, text


def test_a_private_key_passed_as_the_public_key_is_refused(release, out, capsys):
    """A wrong key file is the caller's input (exit 3, naming the key), not a tampered folder (exit 9)."""
    _, _, key, _ = release
    code, text = _gate(capsys, out, "--verify-key", str(key))
    assert code == 3 and "is a private key" in text and "Traceback" not in text, text
    not_a_key = out.parent / "hostname"
    not_a_key.write_text("build-host-7\n")
    code, text = _gate(capsys, out, "--verify-key", str(not_a_key))
    assert code == 3 and "is not a PEM public key" in text and "tampered" not in text, text
