"""``deploy bundle verify|complete DIR``: check a device bundle, or complete it where TensorRT runs."""

from __future__ import annotations

import argparse


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
    import sys
    from pathlib import Path

    from edgedeploy.device import complete_bundle as device
    from edgedeploy.fileio.outdir import SIGNATURE

    argv = [args.bundle, "--runner", args.runner]
    for flag, value in (("--engine", args.engine), ("--workspace-mib", args.workspace_mib)):
        if value:
            argv += [flag, str(value)]
    if args.timing_cache:
        argv += ["--timing-cache", args.timing_cache]
    if args.verbose:
        argv.append("--verbose")
    code = device.main(argv)
    release = Path(args.bundle).resolve().parent
    if code == 0 and (release / SIGNATURE).is_file():  # the device outputs are not under that signature yet
        print(
            f"note: {release / SIGNATURE} predates this step: sign again (deploy sign {release} --key KEY) so "
            "deploy gate --verify-key covers model.engine, engine.json and validation.json",
            file=sys.stderr,
        )
    return code
