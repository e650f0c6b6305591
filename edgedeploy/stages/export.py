"""OnnxFromTorch: export the eager model to ONNX with dynamic axes that stay dynamic.

After export the model is checked with ``onnx.checker`` and ``onnx.shape_inference``
and every named dim is verified to be symbolic (not a baked number) on the graph
inputs; the input spec and checkpoint hash go into ``metadata_props``.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np

from edgedeploy.errors import StageError
from edgedeploy.pipeline.context import BuildContext
from edgedeploy.stages.base import Stage
from edgedeploy.stages.capture import torch_args
from edgedeploy.stages.inputs import feeds_at

ONNX_MODEL = "model.onnx"
TORCHSCRIPT_EXPORTER_MAX_OPSET = 20


def choose_opset(cfg: Any, target: Any) -> int:
    """The opset to export: the config's, else the highest both the target and the exporter handle."""
    return cfg.export.opset or min(target.max_opset, TORCHSCRIPT_EXPORTER_MAX_OPSET)


def dynamic_axes(cfg: Any) -> dict[str, dict[int, str]]:
    """``torch.onnx.export`` dynamic_axes for inputs (named dims) and outputs (batch-like leading dims)."""
    axes: dict[str, dict[int, str]] = {s.name: cfg.dynamic_dims(s) for s in cfg.inputs if cfg.dynamic_dims(s)}
    first = cfg.inputs[0]
    lead = first.shape[0] if first.shape and isinstance(first.shape[0], str) else None
    if lead is not None:
        for name in cfg.outputs:
            axes[name] = {0: lead}
    return axes


def check_onnx(path: Any, cfg: Any, stage: str = "export") -> Any:
    """Run the ONNX checker and strict shape inference; verify named dims are symbolic.

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
            if axis < len(dims) and not dims[axis].dim_param:
                baked.append(f"{spec.name} axis {axis} ('{want}') is fixed at {dims[axis].dim_value}")
    if baked:
        raise StageError(
            stage,
            "dynamic dims were baked into the graph: " + "; ".join(baked),
            hint="remove shape-dependent Python logic on those axes",
        )
    return model


class OnnxFromTorch(Stage):
    name = "export"
    version = "1"
    consumes = ("checkpoint", "model_code")
    produces = (ONNX_MODEL,)

    def config_key(self, ctx: BuildContext) -> Any:
        c = ctx.cfg.to_dict()
        return {
            "model": c["model"],
            "inputs": c["inputs"],
            "dims": c["dims"],
            "outputs": c["outputs"],
            "export": c["export"],
            "opset": choose_opset(ctx.cfg, ctx.target),
        }

    def run(self, ctx: BuildContext) -> dict[str, Any]:
        import onnx
        import torch

        cfg = ctx.cfg
        model = ctx.model()
        opset = choose_opset(cfg, ctx.target)
        args = torch_args(cfg, feeds_at(cfg, "opt", np.random.default_rng(cfg.validate.seed + 2)))
        tmp = ctx.staging / (ONNX_MODEL + ".tmp")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy-exporter deprecation notice is not the user's concern
            try:
                torch.onnx.export(
                    model,
                    args,
                    str(tmp),
                    dynamo=False,
                    input_names=[s.name for s in cfg.inputs],
                    output_names=list(cfg.outputs),
                    dynamic_axes=dynamic_axes(cfg),
                    opset_version=opset,
                    do_constant_folding=True,
                )
            except Exception as exc:  # exporter errors name unsupported aten ops etc.
                tmp.unlink(missing_ok=True)
                raise StageError(
                    self.name,
                    f"torch.onnx.export failed: {type(exc).__name__}: {' '.join(str(exc).split())[:400]}",
                    hint="see the op named above; try another export.opset or exporter",
                ) from None
        check_onnx(tmp, cfg, self.name)
        proto = onnx.load(str(tmp))
        _set_metadata(proto, ctx)
        onnx.save(proto, str(ctx.staging / ONNX_MODEL))
        tmp.unlink(missing_ok=True)
        return {
            "exporter": "torchscript",
            "opset": opset,
            "nodes": len(proto.graph.node),
            "ops": sorted({n.op_type for n in proto.graph.node}),
        }


def _set_metadata(proto: Any, ctx: BuildContext) -> None:
    cfg = ctx.cfg
    meta = {
        "edgedeploy.inputs": json.dumps(cfg.to_dict()["inputs"]),
        "edgedeploy.dims": json.dumps(cfg.to_dict()["dims"]),
        "edgedeploy.outputs": json.dumps(list(cfg.outputs)),
        "edgedeploy.normalization": json.dumps(cfg.model.normalization),
        "edgedeploy.class_names": json.dumps(list(cfg.model.class_names)),
        "edgedeploy.checkpoint_sha256": ctx.sha256("checkpoint") if "checkpoint" in ctx.external else "",
    }
    del proto.metadata_props[:]
    for k, v in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = k, v
