"""``deploy gate``: the release decision on a build's report: integrity, parity, latency policy."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gate",
        help="pass/fail a build for release (exit 0 pass, 9 tampered, 6 build failed, 7 parity, 8 slower)",
    )
    p.add_argument("report", help="report.json of a build, or the build's output folder")
    p.add_argument("--policy", default=None, help="gate policy TOML ([gate] table or top-level keys)")
    p.add_argument("--baseline", default=None, help="report.json of an earlier build to compare latency with")
    p.add_argument(
        "--verify-key",
        default=None,
        metavar="PUB",
        help="PEM public key: the folder's release.sig (deploy sign) must verify over every file, else exit 9",
    )
    p.add_argument("--json", action="store_true", help="print the verdict as JSON instead of the failing checks")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from edgedeploy.artifacts import REPORT
    from edgedeploy.fileio.outdir import FAILED_DIR, SIGNATURE
    from edgedeploy.validate.gate import run_gate

    folder = Path(args.report) if Path(args.report).is_dir() else Path(args.report).parent
    if args.verify_key is None and (folder / SIGNATURE).is_file():
        print(
            f"warning: {folder / SIGNATURE} not checked: pass --verify-key PUB (without it the gate proves "
            "the folder is consistent, not who made it)",
            file=sys.stderr,
        )
    failed, report = folder / FAILED_DIR, folder / REPORT
    if failed.is_dir() and report.is_file() and failed.stat().st_mtime > report.stat().st_mtime:
        # a later build into this folder failed and left the release as it was: the verdict below is that release's
        print(
            f"note: a later build into {folder} failed ({failed}); this verdict is on the previous release it kept",
            file=sys.stderr,
        )

    result = run_gate(args.report, policy_path=args.policy, baseline_path=args.baseline, verify_key=args.verify_key)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        for check in result.failures:
            print(check.line())
        if result.passed:
            print(f"gate passed ({len(result.checks)} checks)")
    if not result.passed:
        raise result.error()
    return 0
