"""``deploy device run OUT [OUT ...] --host [TARGET=]user@host[:port] ...``: the device step over SSH.

For each output folder (a TensorRT target's bundle build) one host: the folder is verified here, the
bundle copied to the host, ``python3 -I complete_bundle.py`` run there, its output streamed, its results
fetched, checked against the bundle and merged into the folder's report.json and manifest.json, so
``deploy gate OUT`` judges the device's rows. Hosts run in parallel; one host's failure leaves the
others' results intact. Exit code: 0 when every host passed, else the first failing host's (in --host
order), each failure printed as one line.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgedeploy.remote.hosts import DeviceHost
    from edgedeploy.remote.step import DeviceOptions

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("device", help="run the device step of TensorRT bundles on devices over SSH")
    dsub = p.add_subparsers(dest="device_command", required=True, metavar="ACTION")
    r = dsub.add_parser(
        "run",
        help="copy each bundle to its device, build and validate there, merge the results into the report",
    )
    r.add_argument("out", nargs="+", help="output folders of TensorRT targets (written by deploy build)")
    r.add_argument(
        "--host",
        action="append",
        required=True,
        metavar="[TARGET=]USER@HOST[:PORT]",
        help="the device that completes the output folder built for TARGET (repeat per target)",
    )
    r.add_argument("--known-hosts", default=DEFAULT_KNOWN_HOSTS, help="host keys to trust (never added to)")
    r.add_argument("--identity", default=None, help="private key for key authentication (default: agent, ~/.ssh)")
    r.add_argument("--python", default="python3", help="the device's Python (run with -I)")
    r.add_argument("--runner", choices=("tensorrt", "onnxruntime"), default="tensorrt", help="what runs the model")
    r.add_argument("--timeout", type=float, default=3600.0, help="seconds the device step may take per host")
    r.add_argument("--connect-timeout", type=float, default=15.0, help="seconds to connect and authenticate")
    r.add_argument("--latency-iters", type=int, default=20, help="timed engine runs on the device (0: none)")
    r.add_argument("--timing-cache", default=None, help="timing cache path on the device, reused across builds")
    r.add_argument("--keep-remote", action="store_true", help="keep the bundle copy on the device")
    r.set_defaults(handler=run_device)


def _target_of(out: Path) -> str:
    """The target a finished TensorRT bundle build was made for.

    Raises:
        InputError: no report, a failed build, or no device bundle in it.
    """
    from edgedeploy.errors import InputError
    from edgedeploy.validate.gate import load_report

    report, _ = load_report(out)
    artifact = str((report.get("model") or {}).get("artifact", ""))
    if report.get("status") != "passed":
        raise InputError(
            f"{out}: the build failed (report status {report.get('status')!r}): there is no device bundle to run",
            hint=f"fix the build and run deploy build --out {out} again (its report says why it failed)",
        )
    if not artifact.endswith("bundle.json"):
        raise InputError(
            f"{out}: a build for target {report.get('target')!r}, whose artifact ({artifact}) runs here: it has no "
            "device bundle (only TensorRT targets make one)",
            hint=f"deploy build --target <a TensorRT target, e.g. jetson-orin> --out OTHER_DIR, then deploy device "
            f"run OTHER_DIR; {out} is validated already",
        )
    return str(report.get("target"))


def run_device(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from edgedeploy.errors import ConfigError
    from edgedeploy.remote.hosts import assign_hosts, parse_host
    from edgedeploy.remote.step import DeviceOptions

    if args.timeout <= 0 or args.connect_timeout <= 0:
        raise ConfigError("--timeout and --connect-timeout must be positive seconds")
    outs = [Path(o) for o in args.out]
    targets = {out: _target_of(out) for out in outs}
    pairs = assign_hosts(targets, [parse_host(h) for h in args.host])
    options = DeviceOptions(
        known_hosts=Path(args.known_hosts).expanduser(),
        identity=Path(args.identity).expanduser() if args.identity else None,
        python=args.python,
        runner=args.runner,
        connect_timeout=args.connect_timeout,
        timeout=args.timeout,
        latency_iters=args.latency_iters,
        timing_cache=args.timing_cache,
        keep_remote=args.keep_remote,
    )
    lock = threading.Lock()

    def say(line: str, err: bool = False) -> None:
        with lock:
            print(line, file=sys.stderr if err else sys.stdout, flush=True)

    with ThreadPoolExecutor(max_workers=len(pairs)) as pool:
        futures = [pool.submit(_one, out, targets[out], host, options, say) for out, host in pairs]
        codes = [f.result() for f in futures]
    return next((c for c in codes if c), 0)


# report formats (matplotlib figures for report.html) are written one folder at a time
_MERGE_LOCK = threading.Lock()


def _one(out: Path, target: str, host: DeviceHost, options: DeviceOptions, say: Callable[..., None]) -> int:
    """One host's step and merge; returns its exit code (its failure printed as one line)."""
    import shutil
    import tempfile

    from edgedeploy.errors import DeployError, ParityError
    from edgedeploy.fileio.integrity import verify_artifacts
    from edgedeploy.pipeline.device_report import SIGNATURE, merge_device_outcome
    from edgedeploy.remote.step import device_message, run_on_device
    from edgedeploy.validate.gate import load_report

    tag = f"[{target} {host.label}]"
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.device-", dir=out.resolve().parent))
    try:
        verify_artifacts(out)
        report, _ = load_report(out)
        model = report["model"]
        bundle = out / str(model["artifact"]).rsplit("/", 1)[0]
        outcome = run_on_device(bundle, str(model["sha256"]), host, options, staging, lambda line: say(f"{tag} {line}"))
        with _MERGE_LOCK:
            merged = merge_device_outcome(out, outcome)
        rows = [r for c in merged["parity"]["candidates"] if c.get("device") for r in c.get("checks", [])]
        status = merged["parity"]["status"]
        say(f"{tag} results merged into {out / 'report.json'}: {len(rows)} device checks, parity {status}")
        if (out / SIGNATURE).exists():
            say(f"{tag} note: {out / SIGNATURE} no longer covers {out}: sign it again with deploy sign {out} --key ...")
        if outcome.exit_code == ParityError.exit_code:
            raise ParityError(f"{host.label}: {device_message(outcome.last_line)}", hint=f"see {out / 'report.json'}")
        return 0
    except DeployError as exc:
        say(f"deploy device: {tag} {exc.one_line()}", err=True)
        return exc.exit_code
    finally:
        shutil.rmtree(staging, ignore_errors=True)
