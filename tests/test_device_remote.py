"""``deploy device run`` against a real OpenSSH server started here on 127.0.0.1.

The server (the distribution's ``/usr/sbin/sshd``; ``.ci/apt-packages.txt`` lists openssh-server) gets a
generated host key, an authorized_keys file with a generated client key, password and keyboard-interactive
login off; the client trusts only a known_hosts file written here. The "device" is this machine: its Python
(this venv, which has onnxruntime) runs the bundle's ``complete_bundle.py -I`` with ``--runner onnxruntime``,
so transport, result checks, the report merge and the gate are real, and TensorRT's numerics stay "skipped".
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import write_unique_tiny_project

from edgedeploy.cli import main
from edgedeploy.errors import (
    ArtifactIntegrityError,
    DeviceTimeoutError,
    DeviceTrustError,
    DeviceUnreachableError,
    ParityError,
)
from edgedeploy.fileio.integrity import verify_artifacts
from edgedeploy.validate.gate import run_gate

SSHD = Path("/usr/sbin/sshd")
pytestmark = [
    pytest.mark.skipif(not SSHD.is_file(), reason="no /usr/sbin/sshd (install openssh-server: .ci/apt-packages.txt)"),
    pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen (openssh-client)"),
    pytest.mark.xdist_group("test_device_remote"),
]
paramiko = pytest.importorskip("paramiko", reason="deploy device run needs paramiko (edgedeploy[device])")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


class Sshd:
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.user = getpass.getuser()
        self.port = _free_port()
        host_pub = _keygen(folder / "host_key")
        self.identity = folder / "client_key"
        (folder / "authorized_keys").write_text(_keygen(self.identity) + "\n")
        self.known_hosts = folder / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {' '.join(host_pub.split()[:2])}\n")
        config = folder / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {folder / 'host_key'}",
                    f"PidFile {folder / 'sshd.pid'}",
                    f"AuthorizedKeysFile {folder / 'authorized_keys'}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "PermitRootLogin prohibit-password",
                    f"AllowUsers {self.user}",
                    "Subsystem sftp internal-sftp",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        self.proc = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.skip(f"sshd did not start here: {self.proc.stdout.read()[-500:] if self.proc.stdout else ''}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        self.stop()
        pytest.skip("sshd did not listen within 15 s")

    def host(self, key: str = "") -> str:
        return f"{key + '=' if key else ''}{self.user}@127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two TensorRT targets' bundle builds of the tiny model (jetson-orin and desktop)."""
    from edgedeploy.api import build

    folder = tmp_path_factory.mktemp("device-project")
    cfg = write_unique_tiny_project(folder)
    outs = {}
    for target in ("jetson-orin", "desktop"):
        result = build(cfg, log=lambda line: None, build__target=target, build__out=str(folder / "out" / target))
        outs[target] = result.out
    return outs


@pytest.fixture
def outs(built, tmp_path):
    """Private copies of the built output folders: ``orin`` and ``desktop``."""
    copies = {}
    for key, target in (("orin", "jetson-orin"), ("desktop", "desktop")):
        copies[key] = tmp_path / "out" / key
        shutil.copytree(built[target], copies[key], ignore=shutil.ignore_patterns(".cache"))
    return copies


def device_run(sshd: Sshd, outs: list[Path], hosts: list[str], *extra: str, python: str = sys.executable) -> int:
    argv = ["device", "run", *map(str, outs)]
    for h in hosts:
        argv += ["--host", h]
    argv += ["--known-hosts", str(sshd.known_hosts), "--identity", str(sshd.identity), "--python", python]
    argv += ["--runner", "onnxruntime", "--connect-timeout", "10", *extra]
    return main(argv)


def _errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("deploy device:")]


def _fits_schema(report: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).resolve().parents[1] / "docs" / "report.schema.json").read_text())
    jsonschema.validate(report, schema)


def _wrapper(folder: Path, body: str) -> str:
    """A stand-in device Python: a shell script that runs ``body`` around the real interpreter."""
    path = folder / f"python-{uuid.uuid4().hex[:6]}"
    path.write_text(f"#!/bin/sh\nREAL={sys.executable}\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_orin_bundle_completes_over_ssh_and_the_gate_judges_the_device_rows(sshd, outs, capsys, tmp_path):
    out = outs["orin"]
    assert device_run(sshd, [out], [sshd.host("orin")]) == 0
    stdout = capsys.readouterr().out
    assert f"[jetson-orin {sshd.user}@127.0.0.1:{sshd.port}] bundle verified" in stdout  # streamed from the device
    assert "runner: onnxruntime (stand-in: no engine built)" in stdout
    report = json.loads((out / "report.json").read_text())
    cands = {c["name"]: c for c in report["parity"]["candidates"]}
    stand_in = cands["onnxruntime@device"]
    assert stand_in["status"] == "passed" and stand_in["checks"] and not stand_in["deploy"]
    assert stand_in["device"]["host"] == f"{sshd.user}@127.0.0.1:{sshd.port}"
    assert cands["tensorrt"]["status"] == "skipped" and "no engine built" in cands["tensorrt"]["reason"]
    assert report["parity"]["status"] == "skipped"  # nothing is claimed about an engine that was not built
    assert report["latency"]["status"] == "skipped"
    assert "bundle/validation.json" in verify_artifacts(out)  # listed in the manifest, hash verified
    _fits_schema(report)
    result = run_gate(out)
    checks = {c.id: c for c in result.checks}
    assert checks["parity:onnxruntime@device:logits"].passed and {"integrity", "binding"} <= set(checks)
    # the stand-in is reported, not accepted in place of the engine that ships: a skipped check stays skipped
    assert not result.passed and not checks["required:parity"].passed
    assert "the deployed artifact was not compared (only onnxruntime@device" in checks["required:parity"].message
    assert main(["gate", str(out)]) == ParityError.exit_code
    stand_in = tmp_path / "stand-in.toml"  # a policy that names the stand-in accepts it, knowingly
    stand_in.write_text('[gate]\nbackends = ["onnxruntime@device"]\n')
    assert main(["gate", str(out), "--policy", str(stand_in)]) == 0
    policy = tmp_path / "engine.toml"
    policy.write_text('[gate]\nrequired_backends = ["tensorrt"]\n')
    assert main(["gate", str(out), "--policy", str(policy)]) == ParityError.exit_code  # no engine yet: refused


def test_a_device_that_disagrees_with_the_goldens_fails_the_command_and_the_gate(sshd, outs, capsys):
    """Its rows are merged as failed (the report says where), the command and the gate exit 7."""
    out = outs["orin"]
    # a device whose runtime adds 0.5 to every output (the bundle itself verifies: the runtime is wrong)
    noisy = (
        'shift; exec "$REAL" -I -c "import runpy, sys, onnxruntime as o; run = o.InferenceSession.run; '
        "o.InferenceSession.run = lambda s, *a, **k: [x + 0.5 for x in run(s, *a, **k)]; "
        'sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name=\'__main__\')" "$@"'
    )
    assert device_run(sshd, [out], [sshd.host("orin")], python=_wrapper(out.parent, noisy)) == 7
    (line,) = _errors(capsys)
    assert "parity failure" in line
    report = json.loads((out / "report.json").read_text())
    assert report["parity"]["status"] == "failed"
    _fits_schema(report)
    assert main(["gate", str(out)]) == ParityError.exit_code


def test_a_bundle_changed_here_is_refused_before_anything_is_copied(sshd, outs, capsys):
    bundle = outs["orin"] / "bundle"
    manifest = json.loads((bundle / "bundle.json").read_text())
    manifest["validation"]["tolerance"] = {"atol": 1.0, "rtol": 1.0}  # looser than the build wrote
    (bundle / "bundle.json").write_text(json.dumps(manifest))
    assert device_run(sshd, [outs["orin"]], [sshd.host("orin")]) == ArtifactIntegrityError.exit_code
    (line,) = _errors(capsys)
    assert "bundle/bundle.json sha256 differs from manifest" in line


def test_a_forged_result_is_refused_and_nothing_is_merged(sshd, outs, capsys):
    out = outs["orin"]
    before = (out / "report.json").read_bytes()
    # the device step runs, then its validation.json loses all rows but one (still "passed")
    forge = (
        '"$REAL" "$@"; code=$?; "$REAL" -c "import json; d = json.load(open(\'validation.json\')); '
        "d['checks'] = d['checks'][:1]; json.dump(d, open('validation.json', 'w'))\"; exit $code"
    )
    code = device_run(sshd, [out], [sshd.host("orin")], python=_wrapper(out.parent, forge))
    assert code == ArtifactIntegrityError.exit_code == 9
    (line,) = _errors(capsys)
    assert "does not match the bundle" in line and "golden checks missing" in line
    assert (out / "report.json").read_bytes() == before and not (out / "bundle" / "validation.json").exists()


def test_a_row_marked_passed_against_its_own_figures_is_refused(sshd, outs, capsys):
    out = outs["orin"]
    forge = (
        '"$REAL" "$@"; code=$?; "$REAL" -c "import json; d = json.load(open(\'validation.json\')); '
        "d['checks'][0]['max_abs'] = 0.5; json.dump(d, open('validation.json', 'w'))\"; exit $code"
    )
    assert device_run(sshd, [out], [sshd.host("orin")], python=_wrapper(out.parent, forge)) == 9
    (line,) = _errors(capsys)
    assert "exceeds atol + rtol" in line


def test_a_wrong_host_key_is_refused_before_anything_is_sent(sshd, outs, capsys, tmp_path):
    other = _keygen(tmp_path / "impostor")
    sshd_known = sshd.known_hosts.read_text()
    sshd.known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {' '.join(other.split()[:2])}\n")
    try:
        assert device_run(sshd, [outs["orin"]], [sshd.host("orin")]) == DeviceTrustError.exit_code == 11
        (line,) = _errors(capsys)
        assert "differs from the one known_hosts" in line and "fix:" in line
        sshd.known_hosts.write_text("")  # unknown host: never added, never accepted
        assert device_run(sshd, [outs["orin"]], [sshd.host("orin")]) == 11
        (line,) = _errors(capsys)
        assert "not in" in line and "unknown host" in line
        assert sshd.known_hosts.read_text() == ""
    finally:
        sshd.known_hosts.write_text(sshd_known)


def test_a_dead_host_is_one_line_and_its_own_code(sshd, outs, capsys):
    dead = f"orin={sshd.user}@127.0.0.1:{_free_port()}"
    assert device_run(sshd, [outs["orin"]], [dead]) == DeviceUnreachableError.exit_code == 12
    (line,) = _errors(capsys)
    assert "device unreachable" in line and "cannot connect" in line


def test_a_device_step_past_its_time_limit_is_stopped(sshd, outs, capsys):
    slow = _wrapper(outs["orin"].parent, 'sleep 30; exec "$REAL" "$@"')
    t0 = time.monotonic()
    assert device_run(sshd, [outs["orin"]], [sshd.host("orin")], "--timeout", "2", python=slow) == 13
    assert time.monotonic() - t0 < 25
    assert DeviceTimeoutError.exit_code == 13
    (line,) = _errors(capsys)
    assert "ran past 2s" in line


def test_two_hosts_complete_two_targets_in_one_command_and_a_failing_one_leaves_the_other(sshd, outs, capsys):
    hosts = [sshd.host("jetson-orin"), sshd.host("desktop")]  # the same sshd twice: two "devices"
    assert device_run(sshd, [outs["orin"], outs["desktop"]], hosts) == 0
    for key in ("orin", "desktop"):
        report = json.loads((outs[key] / "report.json").read_text())
        assert {c["name"]: c["status"] for c in report["parity"]["candidates"]}["onnxruntime@device"] == "passed"
        assert {c.id: c.passed for c in run_gate(outs[key]).checks}["parity:onnxruntime@device:logits"]
    out = capsys.readouterr().out
    assert "[jetson-orin " in out and "[desktop " in out

    desktop_before = (outs["desktop"] / "report.json").read_bytes()
    dead = f"desktop={sshd.user}@127.0.0.1:{_free_port()}"
    shutil.rmtree(outs["orin"] / "bundle" / "validation.json", ignore_errors=True)
    assert device_run(sshd, [outs["orin"], outs["desktop"]], [sshd.host("orin"), dead]) == 12
    (line,) = _errors(capsys)
    assert line.startswith("deploy device: [desktop ")
    assert (outs["desktop"] / "report.json").read_bytes() == desktop_before
    for key in ("orin", "desktop"):  # both keep the stand-in's passing comparison
        assert {c.id: c.passed for c in run_gate(outs[key]).checks}["parity:onnxruntime@device:logits"]


def test_the_device_steps_own_failure_keeps_its_code_and_line(sshd, outs, capsys):
    """complete_bundle.py's exit codes are edgedeploy's: the host reports the device's line with that code."""
    failing = _wrapper(
        outs["orin"].parent,
        'echo "complete_bundle: stage failed: cannot run the engine: RuntimeError: no CUDA device" >&2; exit 6',
    )
    assert device_run(sshd, [outs["orin"]], [sshd.host("orin")], python=failing) == 6
    (line,) = _errors(capsys)
    assert line.endswith(
        "cannot run the engine: RuntimeError: no CUDA device (exit 6) -- fix: see the device's output above"
    )
    assert "stage failed: [device]" in line and line.count("stage failed") == 1
    assert device_run(sshd, [outs["orin"]], [sshd.host("orin")], python="/nonexistent/python3") == 3
    (line,) = _errors(capsys)
    assert "cannot run /nonexistent/python3 there" in line and "--python" in line


def test_a_tensorrt_result_merges_as_the_deployed_engine_and_fits_the_report_schema(outs, tmp_path):
    """The merge of an engine's result (no sshd needed): candidate ``tensorrt``, its latency row, the schema."""
    import hashlib

    from edgedeploy.device import complete_bundle as device
    from edgedeploy.pipeline.device_report import merge_device_outcome
    from edgedeploy.remote.hosts import parse_host
    from edgedeploy.remote.results import check_device_results
    from edgedeploy.remote.step import DeviceOutcome

    out = outs["orin"]
    bundle = out / "bundle"
    staging = tmp_path / "staging"
    shutil.copytree(bundle, staging)
    assert device.main([str(staging), "--runner", "onnxruntime"], log=lambda line: None) == 0
    plan = json.loads((bundle / "plan.json").read_text())
    files = json.loads((bundle / "bundle.json").read_text())["files"]
    engine_bytes = b"an engine as the device built it"
    (staging / "model.engine").write_bytes(engine_bytes)
    record = {
        "schema": "edgedeploy-engine/1",
        "engine": "model.engine",
        "engine_sha256": hashlib.sha256(engine_bytes).hexdigest(),
        "source_onnx": plan["onnx"],
        "source_onnx_sha256": files[plan["onnx"]],
        "target": plan["target"],
        "precision": plan["precision"],
        "tensorrt": "10.3.0.30",
        "gpu": {"name": "Orin", "sm": "8.7"},
    }
    (staging / "engine.json").write_text(json.dumps(record))
    validation = json.loads((staging / "validation.json").read_text())
    latency = {"p50_ms": 2.0, "p90_ms": 2.5, "p99_ms": 3.0, "iters": 20, "shape": {"image": [4, 3, 32, 32]}}
    validation.update(runner="tensorrt (named tensors (execute_async_v3))", engine=record, latency=latency)
    (staging / "validation.json").write_text(json.dumps(validation))
    checked = check_device_results(bundle, staging, runner="tensorrt", host="ci@orin")
    files_back = ("validation.json", "engine.json", "model.engine")
    report = merge_device_outcome(
        out, DeviceOutcome(parse_host("ci@orin"), "tensorrt", staging, files_back, checked, 0, "")
    )
    (cand,) = [c for c in report["parity"]["candidates"] if c["name"] == "tensorrt"]
    assert cand["deploy"] and cand["status"] == "passed" and cand["device"]["gpu"]["sm"] == "8.7"
    assert report["parity"]["status"] == "passed" and report["latency"]["backends"]["tensorrt"]["throughput"] == 2000.0
    _fits_schema(report)
    assert "bundle/model.engine" in verify_artifacts(out)
    gate = run_gate(out)
    assert gate.passed, [c for c in gate.checks if not c.passed]


def test_a_release_signed_before_the_device_step_is_signed_again_after_it(sshd, outs, capsys, tmp_path):
    pytest.importorskip("model_signing", reason="signing needs edgedeploy[sign]")
    out = outs["orin"]
    key = tmp_path / "release"
    assert main(["sign", "--generate-key", str(key)]) == 0
    assert main(["sign", str(out), "--key", f"{key}.key"]) == 0
    bundle_policy = tmp_path / "bundle-gate.toml"
    bundle_policy.write_text('[gate]\nrequired_checks = ["integrity"]\n')
    assert main(["gate", str(out), "--verify-key", f"{key}.pub", "--policy", str(bundle_policy)]) == 0
    assert device_run(sshd, [out], [sshd.host("orin")]) == 0
    assert "no longer covers" in capsys.readouterr().out
    stand_in = tmp_path / "stand-in.toml"  # the device step here is the ONNX Runtime stand-in
    stand_in.write_text('[gate]\nbackends = ["onnxruntime@device"]\n')
    signed = ["gate", str(out), "--verify-key", f"{key}.pub", "--policy", str(stand_in)]
    assert main(signed) == ArtifactIntegrityError.exit_code
    assert main(["sign", str(out), "--key", f"{key}.key"]) == 0
    assert main(signed) == 0


def test_a_device_row_cannot_excuse_itself_from_the_tolerance_by_saying_it_is_not_judged(outs, tmp_path):
    """``agreement_judged: false`` is the build's word for a spec-random golden of an FP16/INT8 artifact. On this
    FP32 bundle every golden judges agreement: rows of garbage figures that call themselves not judged are
    refused, as they are without that word, and nothing is merged."""
    from edgedeploy.device import complete_bundle as device
    from edgedeploy.remote.results import check_device_results

    bundle = outs["orin"] / "bundle"
    assert json.loads((bundle / "plan.json").read_text())["precision"] == "fp32"
    staging = tmp_path / "staging"
    shutil.copytree(bundle, staging)
    assert device.main([str(staging), "--runner", "onnxruntime"], log=lambda line: None) == 0
    validation = json.loads((staging / "validation.json").read_text())
    for row in validation["checks"]:
        row.update(max_abs=3.5, p99_abs=3.0, cosine=0.12, passed=True, agreement_judged=False)
    (staging / "validation.json").write_text(json.dumps(validation))
    with pytest.raises(ArtifactIntegrityError, match="marked agreement_judged false on a golden that judges"):
        check_device_results(bundle, staging, runner="onnxruntime", host="ci@orin")


def _device_result(outs, tmp_path, **tolerance):  # type: ignore[no-untyped-def]
    """(bundle, staging, validation) of the stand-in device step on a copy of the orin bundle, whose bundle.json
    tolerance is updated with ``tolerance`` first (the host's own bundle: no pin involved)."""
    from edgedeploy.device import complete_bundle as device

    bundle = tmp_path / "bundle"
    shutil.copytree(outs["orin"] / "bundle", bundle)
    manifest = json.loads((bundle / "bundle.json").read_text())
    manifest["validation"]["tolerance"].update(tolerance)
    (bundle / "bundle.json").write_text(json.dumps(manifest))
    staging = tmp_path / "staging"
    shutil.copytree(bundle, staging)
    assert device.main([str(staging), "--runner", "onnxruntime"], log=lambda line: None) == 0
    return bundle, staging, json.loads((staging / "validation.json").read_text())


@pytest.mark.parametrize("forgery", ["rows", "pooled", "dropped", "invented"])
def test_a_device_result_whose_pooled_top1_its_rows_do_not_give_is_refused(outs, tmp_path, forgery):
    """The pooled top-1 verdict is derived again on the host from the device's per-golden rows and the bundle's
    tolerance: rows that disagree kept passed, a pooled figure edited, a pooled row dropped or invented are
    refused (exit 9), and nothing is merged."""
    from edgedeploy.remote.results import check_device_results

    bundle, staging, validation = _device_result(outs, tmp_path, min_topk_agreement=0.9)
    rows = validation["checks"]
    pooled = [r for r in rows if r.get("check") == "top1_agreement" and r.get("sample") is None]
    assert len(pooled) == 1 and pooled[0]["passed"]
    check_device_results(bundle, staging, runner="onnxruntime", host="ci@orin")  # as sent: accepted
    if forgery == "rows":  # every golden's top-1 says it disagrees, still marked passed
        for r in rows:
            if "top1_agreement" in r and r.get("sample") is not None:
                r["top1_agreement"] = 0.0
        why = "its per-golden rows say failed"
    elif forgery == "pooled":
        pooled[0]["top1_agreement"] = 0.25
        why = "pooled top-1 of logits is 0.25"
    elif forgery == "dropped":
        rows.remove(pooled[0])
        why = "pooled top1_agreement row of logits missing"
    else:
        rows.append({**pooled[0], "output": "probabilities"})
        why = "pooled top1_agreement row of probabilities the per-golden rows do not give"
    (staging / "validation.json").write_text(json.dumps(validation))
    with pytest.raises(ArtifactIntegrityError, match=why):
        check_device_results(bundle, staging, runner="onnxruntime", host="ci@orin")


@pytest.mark.parametrize(
    "latency, why",
    [
        ({"p50_ms": 2.0}, "are not positive milliseconds"),
        ({"p50_ms": "fast", "p90_ms": 2.0, "p99_ms": 3.0, "iters": 5}, "are not positive milliseconds"),
        ({"p50_ms": -5.0, "p90_ms": 2.0, "p99_ms": 3.0, "iters": 5}, "are not positive milliseconds"),
        ({"p50_ms": 3.0, "p90_ms": 2.0, "p99_ms": 1.0, "iters": 5}, "are not in order"),
        ({"p50_ms": 1.0, "p90_ms": 2.0, "p99_ms": 3.0, "iters": 0}, "iters 0 is not a count"),
        ([1, 2, 3], "latency is list"),
    ],
)
def test_a_device_latency_that_is_no_timing_is_refused_before_anything_is_merged(outs, tmp_path, latency, why):
    import hashlib

    from edgedeploy.remote.results import check_device_results

    bundle, staging, validation = _device_result(outs, tmp_path)
    plan = json.loads((bundle / "plan.json").read_text())
    engine_bytes = b"an engine as the device built it"
    (staging / "model.engine").write_bytes(engine_bytes)
    record = {
        "schema": "edgedeploy-engine/1",
        "engine_sha256": hashlib.sha256(engine_bytes).hexdigest(),
        "source_onnx_sha256": json.loads((bundle / "bundle.json").read_text())["files"][plan["onnx"]],
        "target": plan["target"],
        "precision": plan["precision"],
    }
    (staging / "engine.json").write_text(json.dumps(record))
    validation.update(runner="tensorrt (named tensors (execute_async_v3))", engine=record, latency=latency)
    (staging / "validation.json").write_text(json.dumps(validation))
    with pytest.raises(ArtifactIntegrityError, match=re.escape(why)):
        check_device_results(bundle, staging, runner="tensorrt", host="ci@orin")
    validation["latency"] = {"p50_ms": 1.0, "p90_ms": 2.0, "p99_ms": 3.0, "iters": 5, "shape": {"image": [1, 3]}}
    (staging / "validation.json").write_text(json.dumps(validation))
    check_device_results(bundle, staging, runner="tensorrt", host="ci@orin")  # a timing: accepted


def test_bundle_complete_merges_its_checked_rows_into_the_release_as_device_run_does(outs, tmp_path, capsys):
    """``deploy bundle complete`` inside a release folder: its rows become the report's device candidates (the
    stand-in here, not accepted for the engine that ships unless a policy names it), listed in the manifest."""
    out = outs["orin"]
    assert main(["bundle", "complete", str(out / "bundle"), "--runner", "onnxruntime"]) == 0
    assert "results merged into" in capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    names = {c["name"]: c for c in report["parity"]["candidates"]}
    assert names["onnxruntime@device"]["status"] == "passed" and names["tensorrt"]["status"] == "skipped"
    assert "bundle/validation.json" in json.loads((out / "manifest.json").read_text())["artifacts"]
    assert main(["gate", str(out)]) == ParityError.exit_code  # the deployed engine was not compared
    stand_in = tmp_path / "stand-in.toml"
    stand_in.write_text('[gate]\nbackends = ["onnxruntime@device"]\n')
    assert main(["gate", str(out), "--policy", str(stand_in)]) == 0


def test_the_gate_checks_device_rows_the_report_never_merged(outs, tmp_path, capsys):
    """A validation.json written in the bundle by the device script itself (never merged, so no manifest entry):
    the gate's device check holds its rows to the bundle's goldens and tolerance, not to its status line."""
    from edgedeploy.device import complete_bundle as device

    out = outs["orin"]
    assert device.main([str(out / "bundle"), "--runner", "onnxruntime"], log=lambda line: None) == 0
    integrity = tmp_path / "integrity.toml"
    integrity.write_text('[gate]\nrequired_checks = ["integrity"]\n')
    assert main(["gate", str(out), "--policy", str(integrity)]) == 0
    validation = json.loads((out / "bundle" / "validation.json").read_text())
    for row in validation["checks"]:
        row.update(passed=False, cosine=0.1)  # every row failed; the status line still says passed
    (out / "bundle" / "validation.json").write_text(json.dumps(validation))
    capsys.readouterr()
    assert main(["gate", str(out), "--policy", str(integrity)]) == ArtifactIntegrityError.exit_code
    assert "disagrees with its rows" in capsys.readouterr().out
