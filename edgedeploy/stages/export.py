"""OnnxFromTorch: export the eager model to ONNX with dynamic dims that stay dynamic.

Two exporters: ``torch.onnx.export(dynamo=True)`` with ``torch.export.Dim`` ranges from
the named dims, and the TorchScript-based one (``dynamo=False``). ``export.exporter =
"auto"`` picks the one that natively emits the chosen opset and falls back to the other
on failure, with a warning naming the first error. The opset is the target's ceiling
(``target.max_opset``) capped by the exporter, or ``export.opset`` (never above the
target's ceiling). After export: ``onnx.checker`` + strict shape inference, onnxslim
simplification (kept only when it matches the unsimplified model in ONNX Runtime),
metadata, external data above ``external_data_threshold``, and a run in ONNX Runtime
at min / opt / max / random of every dynamic dim (baked shapes fail here, naming the dim).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.errors import StageError, TargetCapabilityError
from edgedeploy.onnxtools.outputs import (
    declared_shape_problems,
    fix_declared_shapes,
    placeholder_names,
    rename_outputs,
)
from edgedeploy.onnxtools.shapes import (
    compare_shapes,
    example_dims,
    export_dynamic_shapes,
    output_axes,
    probe_feeds,
    probe_points,
)
from edgedeploy.pipeline.context import BuildContext
from edgedeploy.stages.base import Stage
from edgedeploy.stages.capture import outputs_as_numpy, torch_args
from edgedeploy.stages.inputs import feeds_with_dims

ONNX_MODEL = "model.onnx"
ONNX_DATA = "model.onnx.data"
# protobuf cannot serialise a message of 2 GiB; keep a margin for the graph itself
EXTERNAL_DATA_THRESHOLD = 2**31 - 2**27
EXPORTER_OPSETS = {"torchscript": (7, 20), "dynamo": (18, 23)}


def choose_opset(cfg: Any, target: Any, exporter: str | None = None) -> int:
    """The opset to export.

    Default: the target's ceiling (``target.max_opset``) capped by the exporter's highest.
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
    return min(target.max_opset, cap)


def exporter_order(cfg: Any, target: Any) -> list[str]:
    """Exporters to try, in order. auto: the one that emits the opset natively first, the other as fallback."""
    if cfg.export.exporter != "auto":
        return [cfg.export.exporter]
    opset = choose_opset(cfg, target)
    lo, hi = EXPORTER_OPSETS["dynamo"]
    return ["dynamo", "torchscript"] if lo <= opset <= hi else ["torchscript", "dynamo"]


def dynamic_axes(cfg: Any, outputs: dict[str, dict[int, str]] | None = None) -> dict[str, dict[int, str]]:
    """``torch.onnx.export`` dynamic_axes: the inputs' named dims, and ``outputs`` (axis → name per output).

    Without ``outputs`` every output's leading axis follows the first input's leading named dim.
    """
    axes: dict[str, dict[int, str]] = {s.name: cfg.dynamic_dims(s) for s in cfg.inputs if cfg.dynamic_dims(s)}
    if outputs is not None:
        return {**axes, **outputs}
    first = cfg.inputs[0]
    lead = first.shape[0] if first.shape and isinstance(first.shape[0], str) else None
    if lead is not None:
        for name in cfg.outputs:
            axes[name] = {0: lead}
    return axes


def check_onnx(path: Any, cfg: Any, stage: str = "export") -> Any:
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


def weights_bytes(ctx: BuildContext) -> int:
    """Size of the model's weights: the checkpoint file's, else the parameters' and buffers' in memory."""
    if "checkpoint" in ctx.external:
        return ctx.external["checkpoint"].stat().st_size
    model = ctx.model()
    tensors = list(model.parameters()) + list(model.buffers())
    return int(sum(t.numel() * t.element_size() for t in tensors))


class OnnxFromTorch(Stage):
    name = "export"
    version = "2"
    consumes = ("checkpoint", "model_code")
    produces = (ONNX_MODEL,)

    def __init__(self, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> None:
        self.external_data_threshold = external_data_threshold

    def uses_external_data(self, ctx: BuildContext) -> bool:
        """Weights go to ``model.onnx.data`` when they exceed the threshold (decided before the run)."""
        return weights_bytes(ctx) > self.external_data_threshold

    def outputs(self, ctx: BuildContext) -> tuple[str, ...]:
        return (ONNX_MODEL, ONNX_DATA) if self.uses_external_data(ctx) else (ONNX_MODEL,)

    def config_key(self, ctx: BuildContext) -> Any:
        c = ctx.cfg.to_dict()
        return {
            "model": c["model"],
            "inputs": c["inputs"],
            "dims": c["dims"],
            "outputs": c["outputs"],
            "export": c["export"],
            "exporters": exporter_order(ctx.cfg, ctx.target),
            "opset": {e: choose_opset(ctx.cfg, ctx.target, e) for e in exporter_order(ctx.cfg, ctx.target)},
            "external_data": self.uses_external_data(ctx),
        }

    def run(self, ctx: BuildContext) -> dict[str, Any]:
        cfg = ctx.cfg
        model = ctx.model()
        order = exporter_order(cfg, ctx.target)
        args = torch_args(cfg, feeds_with_dims(cfg, example_dims(cfg), np.random.default_rng(cfg.validate.seed + 2)))
        probe = _Probe(cfg, model)
        errors: list[str] = []
        # exporters see placeholder output names: a user name such as 'embedding' may be an internal value's
        temp = dataclasses.replace(cfg, outputs=tuple(placeholder_names(len(cfg.outputs))))
        axes = output_axes(probe.points, probe.references)
        temp_axes = {t: axes[n] for t, n in zip(temp.outputs, cfg.outputs) if n in axes}
        for exporter in order:
            opset = choose_opset(cfg, ctx.target, exporter)
            try:
                proto = _export(exporter, model, args, temp, opset, temp_axes)
                metrics = self._finish(ctx, probe, proto, exporter, order, errors, opset)
            except (_ExportFailed, StageError) as exc:
                # every post-export check (checker, shapes, probes) counts as this exporter failing
                why = exc.message.removeprefix(f"[{self.name}] ") if isinstance(exc, StageError) else str(exc)
                errors.append(f"{exporter}: {why}")
                continue
            if errors:
                ctx.warn(f"export: the {order[0]} exporter failed, used {exporter} instead ({errors[0][:300]})")
            return metrics
        raise StageError(
            self.name,
            ("torch.onnx.export failed with " if len(errors) > 1 else "") + " | ".join(errors),
            hint="see the op or dim named above; try another export.exporter or export.opset",
        )

    def _finish(
        self, ctx: BuildContext, probe: _Probe, proto: Any, used: str, order: list[str], errors: list[str], opset: int
    ) -> dict[str, Any]:
        """Check, simplify, annotate, save and probe the exported model; return the stage metrics."""
        import onnx

        cfg = ctx.cfg
        moved = rename_outputs(proto, list(cfg.outputs))
        tmp = ctx.staging / (ONNX_MODEL + ".tmp")
        onnx.save(proto, str(tmp), save_as_external_data=True, location=tmp.name + ".data", size_threshold=1024)
        try:
            check_onnx(tmp, cfg, self.name)
            proto = onnx.load(str(tmp))
        finally:
            tmp.unlink(missing_ok=True)
            Path(str(tmp) + ".data").unlink(missing_ok=True)

        external = self.uses_external_data(ctx)
        simplify: dict[str, Any] = {"status": "off"}
        if cfg.export.simplify:
            from edgedeploy.onnxtools.simplify import simplify_checked

            if external:
                simplify = {"status": "skipped", "reason": "weights above the external-data threshold"}
                ctx.warn("export: onnxslim simplification skipped (model uses external data)")
            else:
                proto, simplify = simplify_checked(proto, probe.feeds)
                if simplify["status"] == "discarded":
                    ctx.warn(f"export: onnxslim result discarded: {simplify['reason']}")
        shape_fix = fix_declared_shapes(proto, probe.points, probe.references)
        lies = declared_shape_problems(proto, probe.points, probe.references)
        if lies:
            raise StageError(
                self.name,
                "declared output shapes contradict the actual outputs: " + "; ".join(lies[:4]),
                hint="an output size the exporter fixed from the example; make it follow the input dims",
            )
        _set_metadata(proto, ctx, exporter=used)
        out = ctx.staging / ONNX_MODEL
        if external:
            # small (shape) tensors stay inline: ONNX Runtime reads Reshape / Slice shapes only from raw data
            onnx.save(proto, str(out), save_as_external_data=True, location=ONNX_DATA, size_threshold=1024)
        else:
            onnx.save(proto, str(out))
        probes = self._probe(ctx, probe)
        return {
            "exporter": used,
            "exporters_tried": order[: len(errors) + 1],
            "fallback_reason": errors[0] if errors else None,
            "opset": opset,
            "external_data": external,
            "simplify": simplify,
            "shape_probes": probes,
            "nodes": len(proto.graph.node),
            "ops": sorted({n.op_type for n in proto.graph.node}),
            "renamed_internal": moved,
            "declared_shapes": shape_fix,
        }

    def _probe(self, ctx: BuildContext, probe: _Probe) -> dict[str, Any]:
        """Run the saved model in ONNX Runtime at every probe point; compare output shapes with PyTorch.

        Raises:
            StageError: a probe fails to run or returns another shape (the message names the dim).
        """
        from edgedeploy.stages.build_ort import ort_session

        points = probe.points
        try:
            sess = ort_session(str(ctx.staging / ONNX_MODEL))
        except StageError as exc:
            raise StageError(self.name, exc.message) from None
        names = [o.name for o in sess.get_outputs()]

        def run_ort(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(zip(names, sess.run(names, feed)))

        problems, figures = compare_shapes(points, probe.feeds, run_ort, probe.references)
        if problems:
            dims = sorted({p.varied for p, f in zip(points, figures.values()) if not f["ok"] and p.varied})
            raise StageError(
                self.name,
                f"the exported model does not work across dynamic dim(s) {', '.join(repr(d) for d in dims) or 'at opt'}"
                f" (shape baked at export): " + "; ".join(problems[:4]),
                hint="use tensor shapes (x.shape[0], x.size(-1)) instead of Python ints on those dims; "
                "export.exporter = 'dynamo' reports the line that specialises them",
            )
        return {label: f["ok"] for label, f in figures.items()}


class _Probe:
    """Probe points (min / opt / max / random per dynamic dim), their inputs and the eager outputs there."""

    def __init__(self, cfg: Any, model: Any) -> None:
        import torch

        self.points = probe_points(cfg, seed=cfg.validate.seed + 3)
        self.feeds = probe_feeds(cfg, self.points, seed=cfg.validate.seed + 3)
        with torch.inference_mode():
            self.references = [outputs_as_numpy(cfg, model(*torch_args(cfg, f))) for f in self.feeds]


class _ExportFailed(Exception):
    """One exporter failed; the message is the cause in one line."""


def _export(
    exporter: str, model: Any, args: tuple[Any, ...], cfg: Any, opset: int, out_axes: dict[str, dict[int, str]]
) -> Any:
    """Export with one exporter; return the ModelProto. ``out_axes``: dynamic output axes (TorchScript exporter).

    Raises:
        _ExportFailed: the exporter raised, or could not reach the requested opset.
    """
    import os
    import tempfile

    import onnx
    import torch

    input_names = [s.name for s in cfg.inputs]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # exporter deprecation notices are not the user's concern
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
        raise _ExportFailed(root_cause(exc)) from None
    got = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if got != opset:
        raise _ExportFailed(f"produced opset {got}, not the requested {opset} (version conversion failed)")
    return proto


def root_cause(exc: BaseException, limit: int = 600) -> str:
    """The innermost cause of an exporter error in one line, with the user's ``file:line`` when known.

    torch.onnx wraps torch.export's error (which names the specialised dim or the data-dependent
    guard) in a generic "step 1/3" message; the wrapped one is what the user needs.
    """
    import re
    import traceback

    from edgedeploy.stages.capture import user_frame

    inner = exc
    while (inner.__cause__ or inner.__context__) is not None and len(str(inner.__cause__ or inner.__context__)) > 0:
        inner = inner.__cause__ or inner.__context__  # type: ignore[assignment]
    where = user_frame(traceback.extract_tb(inner.__traceback__)) if inner.__traceback__ else None
    text = re.sub(r"\x1b\[[0-9;]*m", "", " ".join(str(inner).split()))
    return f"{type(inner).__name__}{f' at {where}' if where else ''}: {text[:limit]}"


class quiet_torch:
    """Silence torch.export / the dynamo exporter's progress lines and graph dumps (stdout, stderr, logger)."""

    def __enter__(self) -> None:
        import contextlib
        import io

        self._log = logging.getLogger("torch.onnx")
        self._level = self._log.level
        self._log.setLevel(logging.ERROR)
        self._out = contextlib.redirect_stdout(io.StringIO())
        self._err = contextlib.redirect_stderr(io.StringIO())
        self._out.__enter__()
        self._err.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._err.__exit__(*exc)
        self._out.__exit__(*exc)
        self._log.setLevel(self._level)


def _set_metadata(proto: Any, ctx: BuildContext, *, exporter: str = "") -> None:
    cfg = ctx.cfg
    meta = {
        "edgedeploy.inputs": json.dumps(cfg.to_dict()["inputs"]),
        "edgedeploy.dims": json.dumps(cfg.to_dict()["dims"]),
        "edgedeploy.outputs": json.dumps(list(cfg.outputs)),
        "edgedeploy.normalization": json.dumps(cfg.model.normalization),
        "edgedeploy.class_names": json.dumps(list(cfg.model.class_names)),
        "edgedeploy.checkpoint_sha256": ctx.sha256("checkpoint") if "checkpoint" in ctx.external else "",
        "edgedeploy.exporter": exporter,
    }
    del proto.metadata_props[:]
    for k, v in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = k, v
