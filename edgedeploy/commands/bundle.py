"""``deploy bundle verify|complete DIR``: check a device bundle, or complete it where TensorRT runs."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bundle", help="verify or complete a TensorRT device bundle")
    bsub = p.add_subparsers(dest="bundle_command", required=True, metavar="ACTION")
    v = bsub.add_parser("verify", help="check every bundle file against bundle.json's sha256")
    v.add_argument("bundle", help="bundle folder (<out>/bundle)")
    v.set_defaults(handler=run_verify)
    c = bsub.add_parser(
        "complete",
        help="build the engine and validate it against the goldens (what complete_bundle.py does on the device)",
    )
    c.add_argument("bundle", help="bundle folder (<out>/bundle)")
    c.add_argument("--runner", choices=("tensorrt", "onnxruntime"), default="tensorrt", help="what runs the model")
    c.add_argument("--engine", default=None, help="validate this engine instead of building one")
    c.add_argument("--workspace-mib", default=None, help="override the plan's builder workspace")
    c.add_argument("--timing-cache", default=None, help="timing cache file reused across builds")
    c.add_argument("--verbose", action="store_true", help="print TensorRT's builder messages")
    c.set_defaults(handler=run_complete)


def run_verify(args: argparse.Namespace) -> int:
    from edgedeploy.device import complete_bundle as device
    from edgedeploy.errors import ArtifactIntegrityError, InputError

    try:
        manifest = device.verify_bundle(args.bundle)
    except device.IntegrityFailed as exc:
        raise ArtifactIntegrityError(exc.message, hint=exc.hint) from None
    except device.BundleError as exc:
        raise InputError(exc.message, hint=exc.hint) from None
    print(f"OK: {len(manifest['files'])} files in {args.bundle} match bundle.json")
    return 0


def run_complete(args: argparse.Namespace) -> int:
    """The device step on this machine; in a folder ``deploy build`` wrote (report.json and manifest.json beside
    the bundle) its checked results are merged into the report, as ``deploy device run`` merges a device's.

    Raises:
        ArtifactIntegrityError: the release around the bundle is not as built, or the step's results do not
            match the bundle (nothing merged).
    """
    import sys

    from edgedeploy.device import complete_bundle as device
    from edgedeploy.fileio.outdir import SIGNATURE

    release = _release_around(Path(args.bundle), args)  # checked before the step writes anything
    argv = [args.bundle, "--runner", args.runner]
    for flag, value in (("--engine", args.engine), ("--workspace-mib", args.workspace_mib)):
        if value:
            argv += [flag, str(value)]
    if args.timing_cache:
        argv += ["--timing-cache", args.timing_cache]
    if args.verbose:
        argv.append("--verbose")
    code = device.main(argv)
    if release is not None and code in (0, 7):  # validated, passed or not: its rows go into the report
        merged = _merge_into_release(release, Path(args.bundle), args.runner, code)
        print(f"results merged into {release / 'report.json'}: parity {merged['parity']['status']}", file=sys.stderr)
    signed_folder = Path(args.bundle).resolve().parent
    if code == 0 and (signed_folder / SIGNATURE).is_file():  # the device outputs are not under that signature yet
        print(
            f"note: {signed_folder / SIGNATURE} predates this step: sign again (deploy sign {signed_folder} --key "
            "KEY) so deploy gate --verify-key covers model.engine, engine.json and validation.json",
            file=sys.stderr,
        )
    return code


def _release_around(bundle: Path, args: argparse.Namespace) -> Path | None:
    """The output folder ``deploy build`` wrote around ``bundle`` (its report's artifact is this bundle), checked
    against its manifest; None for a bundle copied on its own, or an engine validated from elsewhere.

    Raises:
        ArtifactIntegrityError: the folder's files differ from its manifest.
    """
    from edgedeploy.artifacts import MANIFEST, REPORT
    from edgedeploy.fileio.integrity import verify_artifacts
    from edgedeploy.validate.gate import load_report

    release = bundle.resolve().parent
    if not ((release / REPORT).is_file() and (release / MANIFEST).is_file()):
        return None
    if args.engine and Path(args.engine).resolve().parent != bundle.resolve():
        return None  # an engine kept elsewhere, with its own engine.json: not this release's to merge
    verify_artifacts(release)
    report, _ = load_report(release)
    artifact = str((report.get("model") or {}).get("artifact", ""))
    return release if (release / artifact).resolve() == (bundle.resolve() / "bundle.json") else None


def _merge_into_release(release: Path, bundle: Path, runner: str, code: int) -> dict:
    """Check the step's files in ``bundle`` against it (as a device's results are checked) and merge them into
    ``release``'s report and manifest; returns the new report.

    Raises:
        ArtifactIntegrityError: the results do not match the bundle (the files stay where the step wrote them).
    """
    import getpass
    import json
    import shutil
    import socket
    import tempfile

    from edgedeploy.errors import ArtifactIntegrityError
    from edgedeploy.pipeline.device_report import merge_device_outcome
    from edgedeploy.remote.hosts import DeviceHost
    from edgedeploy.remote.results import ENGINE_RECORD, VALIDATION, check_device_results
    from edgedeploy.remote.step import DeviceOutcome

    host = DeviceHost(user=getpass.getuser(), hostname=socket.gethostname())
    files = [VALIDATION]
    if runner == "tensorrt":
        plan = json.loads((bundle / "plan.json").read_text(encoding="utf-8"))
        files += [ENGINE_RECORD, str(plan.get("engine") or "model.engine")]
    staging = Path(tempfile.mkdtemp(prefix=f".{release.name}.device-", dir=release.parent))
    try:
        for name in files:
            try:
                shutil.copyfile(bundle / name, staging / name)
            except OSError as exc:
                raise ArtifactIntegrityError(
                    f"{bundle}: the device step wrote no readable {name} ({exc.strerror or exc})",
                    hint="run deploy bundle complete again",
                ) from None
        checked = check_device_results(bundle, staging, runner=runner, host=host.label)
        outcome = DeviceOutcome(host, runner, staging, tuple(files), checked, code, "")
        return merge_device_outcome(release, outcome)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
