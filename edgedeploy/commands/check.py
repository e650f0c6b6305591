"""``deploy check``: operator preflight for a target, from a config (export + check) or an existing ONNX file.

Exit 0 when clean or warnings only, 5 when a node cannot run on the target.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="operator preflight: which nodes the target's TensorRT / ONNX Runtime cannot run (no TensorRT needed)",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", "-c", help="deploy.toml: export the model, then check it")
    src.add_argument("--onnx", help="check an existing ONNX file")
    p.add_argument("--target", help="target profile (default: the config's build.target, else cpu)")
    p.add_argument("--targets-file", default=None, help="extra target profiles (TOML)")
    p.add_argument("--dla-core", type=int, default=None, help="check for DLA on this core (Jetson)")
    p.add_argument(
        "--precision",
        default=None,
        choices=("fp32", "fp16", "int8"),
        help="precision the engine will use (DLA checks; default fp32)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="with --config: output folder (default <build.out>-check-<target>)",
    )
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the findings table; return 0, or raise UnsupportedOpsError (exit 5) after printing it.

    Raises:
        InputError: the ONNX file is missing.
        ConfigError: bad config or unknown target.
        UnsupportedOpsError: a finding of severity error.
    """
    if args.onnx:
        findings, target_name = _check_file(args)
    else:
        findings, target_name = _check_config(args)
    _print(findings, target_name, args.json)
    from edgedeploy.onnxtools.opsupport import Finding, raise_on_errors

    raise_on_errors([Finding(**f) for f in findings], target_name)
    return 0


def _check_file(args: argparse.Namespace) -> tuple[list[dict[str, str]], str]:
    from edgedeploy.errors import InputError
    from edgedeploy.onnxtools.opsupport import check_model

    path = Path(args.onnx)
    if not path.is_file():
        raise InputError(f"ONNX file not found: {path}", hint="pass --onnx PATH to an existing .onnx file")
    if path.stat().st_size == 0:  # protobuf parses zero bytes as an empty model with nothing to object to
        raise InputError(f"{path} is empty (0 bytes), not an ONNX model", hint="export the model again")
    from edgedeploy.targets.resolve import resolve_target
    from edgedeploy.trt.provenance import running_tensorrt

    target, _ = resolve_target(args.target or "cpu", targets_file=args.targets_file, local_tensorrt=running_tensorrt)
    target.require_dla(args.dla_core)
    from edgedeploy.onnxspec import read_graph

    read_graph(path, "--onnx")  # an ONNX model, whose external data (if any) stays beside it
    try:
        findings = check_model(path, target, dla_core=args.dla_core, precision=args.precision or "fp32")
    except Exception as exc:  # onnx.load's DecodeError and friends: the file is not an ONNX model
        if type(exc).__module__.startswith("edgedeploy"):
            raise
        raise InputError(f"{path} is not a readable ONNX model ({type(exc).__name__}: {exc})") from None
    return [f.to_dict() for f in findings], target.name


def _check_config(args: argparse.Namespace) -> tuple[list[dict[str, str]], str]:
    from edgedeploy import stagenames as names
    from edgedeploy.config import load_config
    from edgedeploy.errors import UnsupportedOpsError
    from edgedeploy.pipeline.runner import run_build
    from edgedeploy.stages.check import PreflightFromOnnx
    from edgedeploy.stages.export import OnnxFromTorch

    overrides: dict[str, object] = {}
    if args.target:
        overrides["build.target"] = args.target
    if args.targets_file:
        overrides["build.targets_file"] = str(Path(args.targets_file).resolve())
    if args.dla_core is not None:
        overrides["build.dla_core"] = args.dla_core
    if args.precision:
        overrides["precision.mode"] = args.precision
    cfg = load_config(args.config, overrides)
    build_out = Path(cfg.path(cfg.build.out) or "build")
    # beside build.out, not inside it: a build replaces its output folder as a whole
    default_out = build_out.parent / f"{build_out.name}-check-{cfg.build.target}"
    out = Path(args.out).resolve() if args.out else default_out
    cfg = load_config(args.config, {**overrides, "build.out": str(out)})
    try:
        result = run_build(cfg, stages=[OnnxFromTorch(), PreflightFromOnnx()], log=_progress)
    except UnsupportedOpsError as exc:
        return list(exc.findings), cfg.build.target
    return list(result.report["metrics"].get(names.CHECK, {}).get("findings", [])), cfg.build.target


def _progress(line: str) -> None:
    """Stage progress to stderr; the findings table itself is printed once, by this command."""
    import sys

    if line.startswith(("deploy build", "[", "  warning", "build failed")):
        print(line, file=sys.stderr, flush=True)


def _print(findings: list[dict[str, str]], target_name: str, as_json: bool) -> None:
    import json

    from edgedeploy.onnxtools.opsupport import findings_table

    if as_json:
        print(json.dumps({"target": target_name, "findings": findings}, indent=2))
    else:
        print(f"operator preflight for target '{target_name}':")
        print(findings_table(findings))
