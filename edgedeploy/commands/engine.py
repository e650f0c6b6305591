"""``deploy engine check ENGINE``: will this engine load here (or on a given TensorRT / GPU)?"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="TensorRT engine provenance and compatibility checks")
    esub = p.add_subparsers(dest="engine_command", required=True, metavar="ACTION")
    c = esub.add_parser("check", help="verify an engine's sha256 and its TensorRT / GPU against the running ones")
    c.add_argument("engine", help="path to model.engine (its engine.json must sit beside it)")
    c.add_argument("--trt-version", default=None, help="check against this TensorRT version instead of the running one")
    c.add_argument("--sm", default=None, help="check against this GPU compute capability (e.g. 8.7)")
    c.add_argument("--json", action="store_true", help="print the engine record as JSON")
    c.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from edgedeploy.trt.provenance import check_engine

    record = check_engine(Path(args.engine), trt_version=args.trt_version, sm=args.sm)
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        gpu = record.get("gpu") or {}
        print(
            f"OK: {args.engine} (sha256 verified) was built with TensorRT {record.get('tensorrt')} for "
            f"SM {gpu.get('sm') or '?'} ({gpu.get('name') or 'unknown GPU'}), {record.get('precision')}, "
            f"target {record.get('target')}; it loads on "
            + (
                f"TensorRT {args.trt_version or record.get('tensorrt')} / SM {args.sm}"
                if args.trt_version or args.sm
                else "this machine"
            )
        )
    return 0
