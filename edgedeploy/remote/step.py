"""One host's device step: verify the bundle here, copy it over SSH, run it isolated, fetch and check results.

The device runs ``python3 -I complete_bundle.py . --bundle-sha256 <sha>`` in a fresh folder of its own
(``~/.edgedeploy-device/<target>-<sha>-<id>/``, removed afterwards), so the device verifies the very
``bundle.json`` this host verified. Its output lines are streamed to ``log``. The files it writes are
fetched into ``staging`` (a folder the caller owns) and checked by :mod:`edgedeploy.remote.results`;
nothing is written into the output folder here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgedeploy.device import complete_bundle as device
from edgedeploy.errors import (
    ArtifactIntegrityError,
    DeployError,
    EngineCompatibilityError,
    InputError,
    StageError,
)
from edgedeploy.remote.hosts import DeviceHost
from edgedeploy.remote.results import ENGINE_RECORD, VALIDATION, check_device_results
from edgedeploy.remote.ssh import DeviceConnection

REMOTE_ROOT = ".edgedeploy-device"
_PARITY_EXIT = 7


@dataclass(frozen=True)
class DeviceOptions:
    """How to reach and run the devices (the same for every host of one command)."""

    known_hosts: Path
    identity: Path | None = None
    python: str = "python3"
    runner: str = "tensorrt"
    connect_timeout: float = 15.0
    timeout: float = 3600.0
    latency_iters: int = 20
    timing_cache: str | None = None
    keep_remote: bool = False


@dataclass(frozen=True)
class DeviceOutcome:
    """What one host's device step produced: checked results in ``staging``, and its verdict."""

    host: DeviceHost
    runner: str
    staging: Path
    files: tuple[str, ...]
    checked: dict[str, Any]
    exit_code: int  # the device step's: 0 passed, 7 parity failure (results fetched either way)
    last_line: str


def verify_local_bundle(bundle: Path, bundle_sha256: str) -> dict[str, Any]:
    """The bundle as built here, every file checked against bundle.json, and bundle.json against the report.

    Raises:
        ArtifactIntegrityError: a file differs, is missing or unlisted, or bundle.json is not the one built.
        InputError: no bundle manifest.
    """
    try:
        return device.verify_bundle(str(bundle), bundle_sha256)
    except device.IntegrityFailed as exc:
        raise ArtifactIntegrityError(exc.message, hint=exc.hint) from None
    except device.BundleError as exc:
        raise InputError(exc.message, hint=exc.hint) from None


_DEVICE_KINDS = ("input error", "stage failed", "parity failure", "artifact integrity error", "engine incompatible")


def device_message(line: str) -> str:
    """The device step's last line without its ``complete_bundle: <kind>: `` prefix (the host names the kind)."""
    text = line[len("complete_bundle: ") :] if line.startswith("complete_bundle: ") else line
    kind, sep, rest = text.partition(": ")
    return rest if sep and kind in _DEVICE_KINDS else text


def _device_error(code: int, host: DeviceHost, line: str) -> DeployError:
    """The device step's own failure (its exit codes are edgedeploy's), as this host reports it."""
    message = f"{host.label}: {device_message(line) or f'the device step exited {code}'}"
    if code == InputError.exit_code:
        return InputError(message)
    if code == ArtifactIntegrityError.exit_code:
        return ArtifactIntegrityError(message)
    if code == EngineCompatibilityError.exit_code:
        return EngineCompatibilityError(message)
    return StageError("device", f"{message} (exit {code})", hint="see the device's output above")


def run_on_device(
    bundle: Path,
    bundle_sha256: str,
    host: DeviceHost,
    options: DeviceOptions,
    staging: Path,
    log: Callable[[str], None],
) -> DeviceOutcome:
    """Run the device step for ``bundle`` on ``host``; return its checked results (fetched into ``staging``).

    Raises:
        ArtifactIntegrityError: the bundle here, or the result sent back, does not check out.
        DeviceTrustError, DeviceUnreachableError, DeviceTimeoutError: SSH (see :mod:`edgedeploy.remote.ssh`).
        InputError, StageError, EngineCompatibilityError: the device step itself failed (its code and line).
    """
    manifest = verify_local_bundle(bundle, bundle_sha256)
    try:
        plan = device.read_json(str(bundle / manifest.get("plan", "plan.json")), "build plan")
    except device.BundleError as exc:
        raise InputError(exc.message, hint=exc.hint) from None
    target = str(plan.get("target") or "bundle")
    names = sorted(manifest["files"]) + [device.BUNDLE_MANIFEST]
    remote = f"{REMOTE_ROOT}/{target}-{bundle_sha256[:12]}-{uuid.uuid4().hex[:8]}"
    last = [""]

    def relay(line: str) -> None:
        if line.strip():
            last[0] = line.strip()
        log(line)

    with DeviceConnection(
        host, known_hosts=options.known_hosts, identity=options.identity, connect_timeout=options.connect_timeout
    ) as conn:
        log(f"connected; copying {len(names)} bundle files to {remote}")
        try:
            for name in names:
                if "/" in name:
                    conn.makedirs(f"{remote}/{name.rsplit('/', 1)[0]}")
                else:
                    conn.makedirs(remote)
                conn.upload(bundle / name, f"{remote}/{name}")
            argv = [options.python, "-I", "complete_bundle.py", ".", "--runner", options.runner]
            argv += ["--bundle-sha256", bundle_sha256, "--latency-iters", str(options.latency_iters)]
            if options.timing_cache:
                argv += ["--timing-cache", options.timing_cache]
            code = conn.run(argv, cwd=remote, timeout=options.timeout, log=relay)
            if code in (126, 127):  # the shell's "not executable" / "not found"
                raise InputError(
                    f"{host.label}: cannot run {options.python} there ({device_message(last[0])})",
                    hint="pass --python PATH to the device's Python 3 (with TensorRT's bindings and numpy)",
                )
            if code not in (0, _PARITY_EXIT):
                raise _device_error(code, host, last[0])
            fetched = [VALIDATION]
            if options.runner == "tensorrt":
                fetched += [ENGINE_RECORD, str(plan.get("engine") or "model.engine")]
            for name in fetched:
                if not conn.exists(f"{remote}/{name}"):
                    raise ArtifactIntegrityError(
                        f"{host.label}: the device step exited {code} but wrote no {name}",
                        hint="run the device step again",
                    )
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                conn.download(f"{remote}/{name}", staging / name)
        finally:
            if not options.keep_remote:
                conn.remove_tree(remote)
    checked = check_device_results(bundle, staging, runner=options.runner, host=host.label)
    return DeviceOutcome(host, options.runner, staging, tuple(fetched), checked, code, last[0])
