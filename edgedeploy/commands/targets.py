"""``deploy targets``: list target profiles and what each can do."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgedeploy.targets import TargetProfile


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
        f"{'target':<17} {'runtime':<11} {'arch':<7} {'JetPack':<7} {'TRT':<5} {'CUDA':<4} {'SM':<3} {'DLA':<3} "
        f"{'opset':<5} {'precisions':<14} {'INT8 route':<16} {'mem MiB':>7} {'ws MiB':>6} {'py':<4} built"
    )
    for t in targets.values():
        where = "here" if t.builds_here else "on device (bundle written here)"
        print(
            f"{t.name:<17} {t.runtime:<11} {t.arch:<7} {t.jetpack or '-':<7} {t.trt_version or '-':<5} "
            f"{t.cuda_version or '-':<4} {t.sm or '-':<3} {t.dla_cores:<3} {t.max_opset:<5} "
            f"{','.join(t.precisions):<14} {_int8_route(t):<16} {t.memory_mib or '-':>7} {t.workspace_mib:>6} "
            f"{t.device_python or '-':<4} {where}"
        )
    return 0


def _int8_route(t: TargetProfile) -> str:
    """How INT8 gets into an engine on this target (explicit Q/DQ, calibration cache) or why not."""
    from edgedeploy import runtimes

    if not t.supports_precision("int8"):
        return "none (no INT8)"
    return "QDQ or calib" if t.implicit_int8 else runtimes.get(t.runtime).int8_route
