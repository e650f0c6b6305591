"""``deploy build``: run the pipeline for one target and print the results table."""

from __future__ import annotations

import argparse

from edgedeploy.commands._common import FlagHelpFormatter, add_config_flags, config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build",
        help="build and validate an artifact for a target",
        description="Build and validate an artifact for a target, from a deploy.toml (--config) or from flags alone "
        "(--factory MODULE:FN --input NAME:SHAPE, or --onnx MODEL.onnx). Flags override config fields.",
        formatter_class=FlagHelpFormatter,
    )
    add_config_flags(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="print report.json to stdout instead of the table (a failed build's report too)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from edgedeploy.errors import DeployError
    from edgedeploy.pipeline.report import results_table
    from edgedeploy.pipeline.runner import run_build

    cfg = config_from_args(args)
    log_file = Path(args.log_file) if getattr(args, "log_file", None) else None
    quiet = bool(getattr(args, "quiet", False))
    try:
        result = run_build(cfg, verbose=bool(getattr(args, "verbose", False)), quiet=quiet, log_file=log_file)
    except DeployError as exc:
        if args.json and exc.report is not None:  # a failed build's report (OUT/.last-failed/), then the error line
            print(json.dumps(exc.report, indent=2))
        raise
    if args.json:
        print(json.dumps(result.report, indent=2))
    else:
        if not quiet:
            print(results_table(result.report))
        cached = sum(r.status == "cached" for r in result.stages)
        verdict = result.report["status"].upper()
        if (result.report.get("parity") or {}).get("status") == "skipped":
            # never let a bundle-only build read as a validated artifact
            verdict += " (host stages only; parity skipped here, checked on the device)"
        print(
            f"\n{verdict}: target {result.target}, {result.precision}, "
            f"{result.seconds:.1f}s ({cached} of {len(result.stages)} stages cached) -> {result.out}"
        )
        for line in result.report.get("notes", []):
            print(line)
    return 0
