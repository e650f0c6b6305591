"""``deploy targets``: list target profiles and what each can do."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("targets", help="list target profiles and their capabilities")
    p.add_argument("--targets-file", default=None, help="extra target profiles (TOML)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import json

    from edgedeploy.targets import all_targets

    targets = all_targets(args.targets_file)
    if args.json:
        print(json.dumps({n: t.capabilities() for n, t in targets.items()}, indent=2))
        return 0
    print(
        f"{'target':<18} {'runtime':<12} {'arch':<8} {'TRT':<6} {'CUDA':<5} {'SM':<4} {'DLA':<4} "
        f"{'opset':<6} {'precisions':<16} built"
    )
    for t in targets.values():
        where = "here" if t.builds_here else "on device (bundle written here)"
        print(
            f"{t.name:<18} {t.runtime:<12} {t.arch:<8} {t.trt_version or '-':<6} {t.cuda_version or '-':<5} "
            f"{t.sm or '-':<4} {t.dla_cores:<4} {t.max_opset:<6} {','.join(t.precisions):<16} {where}"
        )
    return 0
