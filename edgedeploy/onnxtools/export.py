"""Export helpers over torch.onnx: opset choice, exporter order, dynamic axes, the ONNX checker, one export call."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from edgedeploy.errors import StageError, TargetCapabilityError
from edgedeploy.modelio.torchutil import quiet_torch, root_cause
from edgedeploy.onnxtools.shapes import export_dynamic_shapes

if TYPE_CHECKING:
    from pathlib import Path

    from edgedeploy.config import DeployConfig
    from edgedeploy.targets import TargetProfile

# protobuf cannot serialise a message of 2 GiB; keep a margin for the graph itself
EXTERNAL_DATA_THRESHOLD = 2**31 - 2**27


EXPORTER_OPSETS = {"torchscript": (7, 20), "dynamo": (18, 23)}


def choose_opset(cfg: DeployConfig, target: TargetProfile, exporter: str | None = None) -> int:
    """The opset to export.

    Default: the target's export opset (``target.export_opset``: its ceiling, or lower where the
    parser lacks an op that a lower opset decomposes) capped by the exporter's highest.
    ``export.opset`` overrides it, but never above the target's ceiling.

    Raises:
        TargetCapabilityError: ``export.opset`` is above what the target's runtime parses.
    """
    if cfg.export.opset is not None:
        if cfg.export.opset > target.max_opset:
            raise TargetCapabilityError(
                f"export.opset = {cfg.export.opset} is above what target '{target.name}' parses "
                f"(max opset {target.max_opset})",
                hint=f"drop export.opset or set it to {target.max_opset} or lower",
            )
        return cfg.export.opset
    cap = EXPORTER_OPSETS[exporter][1] if exporter else max(hi for _, hi in EXPORTER_OPSETS.values())
    return min(target.export_opset, cap)


def exporter_order(cfg: DeployConfig, target: TargetProfile) -> list[str]:
    """Exporters to try, in order. auto: the one that emits the opset natively first, the other as fallback."""
    if cfg.export.exporter != "auto":
        return [cfg.export.exporter]
    opset = choose_opset(cfg, target)
    lo, hi = EXPORTER_OPSETS["dynamo"]
    return ["dynamo", "torchscript"] if lo <= opset <= hi else ["torchscript", "dynamo"]


def cheapest_first(order: list[str], capture: dict[str, Any] | None) -> tuple[list[str], str]:
    """``order`` with the TorchScript exporter first when the capture stage proved tracing this model safe,
    and why.

    The TorchScript exporter traces the model as ``torch.jit.trace`` does; where that trace matched eager
    PyTorch at every probe point with no TracerWarning in the user's code (``capture.route == "trace"``), it
    exports the same graph at a fraction of the dynamo exporter's cost (bench/profile_build.py: 2-3x less
    on EfficientNet / MiniLM-size models). Otherwise the order stays (dynamo first where it emits the opset
    natively), and a failing first exporter still falls back to the other.
    """
    capture = capture or {}
    user_warnings = len(capture.get("tracer_warnings") or []) - int(capture.get("tracer_warnings_library") or 0)
    if "torchscript" not in order or order[0] == "torchscript":
        return order, "the exporter that emits the opset natively"
    if capture.get("route") != "trace" or user_warnings > 0:
        return order, "the exporter that emits the opset natively (tracing not proven for this model)"
    return ["torchscript", *(e for e in order if e != "torchscript")], (
        "the cheaper exporter: the trace capture matched eager at every probe point"
    )


def dynamic_axes(cfg: DeployConfig, outputs: dict[str, dict[int, str]] | None = None) -> dict[str, dict[int, str]]:
    """``torch.onnx.export`` dynamic_axes: the inputs' named dims whose sizes vary (min < max), and ``outputs``
    (axis → name per output).

    A named dim with min = max is exported at its size, as the dynamo exporter does (``export_dynamic_shapes``):
    a symbolic dim that never varies only makes TensorRT ask for an optimization profile, and DLA refuse it.
    Without ``outputs`` every output's leading axis follows the first input's leading named dim.
    """
    varying = {name for name, d in cfg.dims.items() if d.min < d.max}
    axes: dict[str, dict[int, str]] = {}
    for spec in cfg.inputs:
        named = {axis: name for axis, name in cfg.dynamic_dims(spec).items() if name in varying}
        if named:
            axes[spec.name] = named
    if outputs is not None:
        return {**axes, **outputs}  # the output axes seen to change size between probe points
    first = cfg.inputs[0]
    lead = first.shape[0] if first.shape and isinstance(first.shape[0], str) and first.shape[0] in varying else None
    if lead is not None:
        for name in cfg.outputs:
            axes[name] = {0: lead}
    return axes


def check_onnx(path: str | Path, cfg: DeployConfig, stage: str = "export") -> Any:
    """Run the ONNX checker and strict shape inference; verify named dims are symbolic on the inputs.

    Returns the shape-inferred model.

    Raises:
        StageError: the checker fails, shape inference fails, or a named dim was baked.
    """
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=False)
        model = onnx.shape_inference.infer_shapes(onnx.load(str(path)), strict_mode=True)
    except Exception as exc:  # onnx raises several unrelated exception types
        raise StageError(stage, f"ONNX model fails the checker: {' '.join(str(exc).split())[:300]}") from None
    by_name = {i.name: i for i in model.graph.input}
    baked = []
    for spec in cfg.inputs:
        graph_in = by_name.get(spec.name)
        if graph_in is None:
            raise StageError(
                stage,
                f"exported model has no input named {spec.name!r}",
                hint="input names in the config must match the model's forward() arguments",
            )
        dims = graph_in.type.tensor_type.shape.dim
        for axis, want in cfg.dynamic_dims(spec).items():
            d = cfg.dims[want]
            if axis < len(dims) and not dims[axis].dim_param and d.min < d.max:
                baked.append(f"{spec.name} axis {axis} ('{want}') is fixed at {dims[axis].dim_value}")
    if baked:
        raise StageError(
            stage,
            "dynamic dims were baked into the graph: " + "; ".join(baked),
            hint="remove shape-dependent Python logic on those axes",
        )
    return model


class ExportFailed(Exception):
    """One exporter failed; the message is the cause in one line."""


def export_proto(
    exporter: str, model: Any, args: tuple[Any, ...], cfg: Any, opset: int, out_axes: dict[str, dict[int, str]]
) -> Any:
    """Export with one exporter; return the ModelProto. ``out_axes``: dynamic output axes (TorchScript exporter).

    Raises:
        ExportFailed: the exporter raised, or could not reach the requested opset.
    """
    import os
    import tempfile

    import onnx
    import torch

    input_names = [s.name for s in cfg.inputs]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # exporter deprecation notices are not the user's concern
            # a value the user's code froze is their concern: the caller attributes it (modelio.tracing)
            warnings.simplefilter("always", torch.jit.TracerWarning)
            if exporter == "dynamo":
                with quiet_torch():
                    program = torch.onnx.export(
                        model,
                        args,
                        dynamo=True,
                        input_names=input_names,
                        output_names=list(cfg.outputs),
                        dynamic_shapes=export_dynamic_shapes(cfg),
                        opset_version=opset,
                        optimize=True,
                        verbose=False,
                    )
                if program is None:  # only when given a file name, which is not the case here
                    raise RuntimeError("torch.onnx.export returned no program")
                proto = program.model_proto
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    path = os.path.join(tmp, "model.onnx")
                    torch.onnx.export(
                        model,
                        args,
                        path,
                        dynamo=False,
                        input_names=input_names,
                        output_names=list(cfg.outputs),
                        dynamic_axes=dynamic_axes(cfg, out_axes),
                        opset_version=opset,
                        do_constant_folding=True,
                    )
                    proto = onnx.load(path)
    except Exception as exc:  # exporter errors name unsupported aten ops, specialised dims etc.
        raise ExportFailed(root_cause(exc)) from None
    got = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if got != opset:
        raise ExportFailed(f"produced opset {got}, not the requested {opset} (version conversion failed)")
    return proto
