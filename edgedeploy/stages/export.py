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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgedeploy import stagenames as names
from edgedeploy.artifacts import ONNX_DATA, ONNX_MODEL
from edgedeploy.errors import StageError
from edgedeploy.modelio.goldens import NOT_DETERMINISTIC_FIX, not_deterministic
from edgedeploy.modelio.inputs import feeds_with_dims
from edgedeploy.modelio.torchutil import outputs_as_numpy, torch_args
from edgedeploy.modelio.tracing import (
    SIZE_IN_LINE,
    TracerFinding,
    TracerWarnings,
    frozen_value_fix,
    frozen_value_hint,
    is_branch,
)
from edgedeploy.onnxtools.export import (
    EXPORTER_OPSETS,
    EXTERNAL_DATA_THRESHOLD,
    ExportFailed,
    cheapest_first,
    check_onnx,
    choose_opset,
    export_proto,
    exporter_order,
)
from edgedeploy.onnxtools.ort import ort_session
from edgedeploy.onnxtools.outputs import (
    declared_shape_problems,
    fix_declared_shapes,
    placeholder_names,
    rename_outputs,
)
from edgedeploy.onnxtools.shapes import (
    EDGE_POINT,
    PROBE_SEED,
    compare_shapes,
    example_dims,
    output_axes,
    probe_feeds,
    probe_points,
)
from edgedeploy.stages.base import BuildContext, Stage, StageResult, model_inputs

if TYPE_CHECKING:
    from edgedeploy.config import DeployConfig


_FROZE = "tracing froze Python values into the graph"  # an exporter's failure for TracerWarnings at the user's lines


def weights_bytes(ctx: BuildContext) -> int:
    """Size of the model's weights: the checkpoint file's, else the parameters' and buffers' in memory."""
    if "checkpoint" in ctx.external:
        return ctx.external["checkpoint"].stat().st_size
    model = ctx.model()
    tensors = list(model.parameters()) + list(model.buffers())
    return int(sum(t.numel() * t.element_size() for t in tensors))


class OnnxFromTorch(Stage):
    name = names.EXPORT
    # 4: a named dim with min = max is exported at its size (TorchScript exporter, as dynamo)
    # 5: a factory without checkpoint builds its weights from a fixed seed (entries of unseeded ones differ)
    # 6: the probes compare values within the FP32 tolerance, not shapes only
    # 7: a trace that froze Python values at the user's lines fails that exporter (export.fail_on_tracer_warnings)
    # 8: a probe at the inputs' range edges (modelio.generators.edge_values)
    version = "8"
    produces = (ONNX_MODEL,)

    def __init__(self, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> None:
        self.external_data_threshold = external_data_threshold
        self._decided: dict[str, bool] = {}  # staging folder -> external data, decided by run() (no checkpoint)

    def uses_external_data(self, ctx: BuildContext) -> bool:
        """Weights go to ``model.onnx.data`` when they exceed the threshold (builds the model without a
        checkpoint: its weights are the factory's)."""
        return weights_bytes(ctx) > self.external_data_threshold

    def _known_external(self, ctx: BuildContext) -> bool | None:
        """Whether the weights go to external data, where known without building the model (a checkpoint's
        size; or what this build's run decided); None before the run of a model without a checkpoint. A cached
        build then never builds the model (nor imports torch): its files are the model code's, in the key."""
        if "checkpoint" in ctx.external:
            return self.uses_external_data(ctx)
        return self._decided.get(str(ctx.staging))

    def outputs(self, ctx: BuildContext) -> tuple[str, ...]:
        return (ONNX_MODEL, ONNX_DATA) if self._known_external(ctx) else (ONNX_MODEL,)

    def inputs(self, ctx: BuildContext) -> tuple[str, ...]:
        return model_inputs(ctx)

    def config_key(self, ctx: BuildContext) -> Any:
        c = ctx.cfg.to_dict()
        return {
            "model": c["model"],
            "inputs": c["inputs"],
            "dims": c["dims"],
            "outputs": c["outputs"],
            "export": c["export"],
            "exporters": _order(ctx)[0],
            "opset": {e: choose_opset(ctx.cfg, ctx.target, e) for e in exporter_order(ctx.cfg, ctx.target)},
            "external_data": self.uses_external_data(ctx) if "checkpoint" in ctx.external else "model code",
            # the probes: their random sizes and inputs, and the tolerance their values are held to
            "probe_seed": ctx.cfg.validate.seed,
            "fp32_tolerance": dataclasses.asdict(ctx.cfg.tolerance_for("fp32")),
        }

    def run(self, ctx: BuildContext) -> StageResult:
        cfg = ctx.cfg
        model = ctx.model()
        order, why = _order(ctx)
        args = torch_args(cfg, feeds_with_dims(cfg, example_dims(cfg), np.random.default_rng(cfg.validate.seed + 2)))
        probe = _Probe(cfg, model, ctx.probe_outputs)
        errors: list[str] = []
        frozen: list[TracerFinding] = []  # TracerWarnings at the user's own lines, while an exporter traced
        tracers: set[str] = set()  # the exporters that froze them (their failures follow from those lines)
        # exporters see placeholder output names: a user name such as 'embedding' may be an internal value's
        temp = dataclasses.replace(cfg, outputs=tuple(placeholder_names(len(cfg.outputs))))
        axes = output_axes(probe.points, probe.references)
        temp_axes = {t: axes[n] for t, n in zip(temp.outputs, cfg.outputs) if n in axes}
        for exporter in order:
            opset = choose_opset(cfg, ctx.target, exporter)
            ctx.status(f"exporting with the {exporter} exporter, opset {opset}")
            warnings: list[str] = []  # this exporter's; dropped with it when a later check fails
            try:
                with TracerWarnings() as traced:
                    proto = export_proto(exporter, model, args, temp, opset, temp_axes)
                frozen += [f for f in traced.user if f not in frozen]
                if traced.user:
                    tracers.add(exporter)
                metrics = self._finish(ctx, probe, proto, exporter, order, errors, opset, warnings)
                metrics["exporter_order_why"] = why
                if traced.user:  # the probes passed, yet the graph holds values the user's code computed
                    self._frozen_values(cfg, exporter, traced.user, metrics, warnings)
            except (ExportFailed, StageError) as exc:
                # every post-export check (checker, shapes, probes) counts as this exporter failing
                reason = exc.message.removeprefix(f"[{self.name}] ") if isinstance(exc, StageError) else str(exc)
                errors.append(f"{exporter}: {reason}")
                continue
            if errors:
                warnings.append(f"export: the {order[0]} exporter failed, used {exporter} instead ({errors[0][:300]})")
            return StageResult(metrics, warnings=warnings)
        atol = cfg.tolerance_for("fp32").atol or 1e-4
        moving = not_deterministic(model, cfg, probe.feeds[0], probe.references[0], atol)
        if moving:  # no exporter can match a reference that moves: that is the one line
            raise StageError(self.name, f"eager PyTorch is not deterministic: {moving}", hint=NOT_DETERMINISTIC_FIX)
        dims = _dims_named(errors)
        if frozen and dims:  # a dynamic dim was baked and the user's own line froze a size: that is the one line
            source, fix = frozen_value_fix(frozen[0])
            what = "a tensor size" if SIZE_IN_LINE.search(source) else "a value computed from a tensor"
            error = StageError(
                self.name,
                f"{frozen[0].where} freezes {what} into the graph as a Python number"
                + (f" (`{source}`)" if source else "")
                + ", so the exported model works only at the example's size of dim(s) "
                + ", ".join(f"'{d}'" for d in dict.fromkeys(dims))
                + (f" (+{len(frozen) - 1} more such line(s))" if len(frozen) > 1 else ""),
                hint=fix,
            )
            # each exporter's own message stays in report.json (the symptoms, for whoever digs deeper)
            error.partial = StageResult({"errors": errors, "frozen": [str(f) for f in frozen]})
            raise error
        if frozen:  # an exporter traced values of the user's code into the graph: that line is the one to fix
            source = frozen_value_fix(frozen[0])[0].partition("  #")[0]
            others = [e.partition(":")[0] for e in errors if e.partition(":")[0] not in tracers]
            error = StageError(
                self.name,
                f"{frozen[0].where} freezes a Python value into the graph (`{source}`: "
                f"{frozen[0].message.partition(' might ')[0]})"
                + (f" (+{len(frozen) - 1} more such line(s))" if len(frozen) > 1 else "")
                + (f"; the {', '.join(others)} exporter failed too (report.json)" if others else ""),
                hint=frozen_value_hint(frozen[0], accept=cfg.export.fail_on_tracer_warnings),
            )
            error.partial = StageResult({"errors": errors, "frozen": [str(f) for f in frozen]})
            raise error
        edges = any(f"at {EDGE_POINT}:" in e for e in errors)
        raise StageError(
            self.name,
            ("torch.onnx.export failed with " if len(errors) > 1 else "") + " | ".join(errors),
            hint=_export_fix(ctx, order)
            + (
                "; or, where PyTorch's own answer at the range edges is arbitrary (tied scores ranked by TopK), "
                "set export.edge_probe = false (--no-edge-probe)"
                if edges
                else ""
            ),
        )

    def _frozen_values(
        self,
        cfg: DeployConfig,
        exporter: str,
        found: list[TracerFinding],
        metrics: dict[str, Any],
        warnings: list[str],
    ) -> None:
        """An exporter that traced the model froze Python values at the user's lines (TracerWarnings), and every
        probe passed. A branch on tensor values (``if x.amax() > 100:``) takes the example's path for every input,
        and the probes' inputs may all take that path too: it fails, as a traced capture does, unless
        ``export.fail_on_tracer_warnings = false``. A number (``math.sqrt(q.size(-1))``, ``int(self.steps)``) the
        probes checked at every size and at the range edges: one warning per line.

        Raises:
            StageError: a frozen branch, with ``export.fail_on_tracer_warnings`` (the default).
        """
        branches = [f for f in found if is_branch(f)]
        if branches and cfg.export.fail_on_tracer_warnings:
            raise StageError(
                self.name,
                f"{_FROZE} ({len(branches)} TracerWarning(s) in your code): "
                + " | ".join(str(f) for f in branches[:2])
                + (f" (+{len(branches) - 2} more)" if len(branches) > 2 else ""),
            )
        metrics["tracer_warnings"] = [str(f) for f in found]
        warnings.extend(
            f"export: the {exporter} exporter froze a Python value at {f.where} ("
            + ("a branch, accepted by export.fail_on_tracer_warnings = false" if is_branch(f) else "a number")
            + "): the graph matched PyTorch at the probe inputs"
            for f in found
        )

    def _finish(
        self,
        ctx: BuildContext,
        probe: _Probe,
        proto: Any,
        used: str,
        order: list[str],
        errors: list[str],
        opset: int,
        warnings: list[str],
    ) -> dict[str, Any]:
        """Check, simplify, annotate, save and probe the exported model; return the stage metrics
        (warnings for the user go to ``warnings``)."""
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

        external = self._decided[str(ctx.staging)] = self.uses_external_data(ctx)
        simplify: dict[str, Any] = {"status": "off"}
        if cfg.export.simplify:
            from edgedeploy.onnxtools.simplify import simplify_checked

            if external:
                simplify = {"status": "skipped", "reason": "weights above the external-data threshold"}
                warnings.append("export: onnxslim simplification skipped (model uses external data)")
            else:
                proto, simplify = simplify_checked(proto, probe.feeds)
                if simplify["status"] == "discarded":
                    warnings.append(f"export: onnxslim result discarded: {simplify['reason']}")
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
        probes = self._probe(ctx, probe, used)
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

    def _probe(self, ctx: BuildContext, probe: _Probe, exporter: str = "") -> dict[str, Any]:
        """Run the saved model in ONNX Runtime at every probe point; compare output shapes with PyTorch.

        Raises:
            StageError: a probe fails to run or returns another shape (the message names the dim).
        """
        points = probe.points
        try:
            sess = ort_session(str(ctx.staging / ONNX_MODEL))
        except StageError as exc:
            raise StageError(self.name, exc.message) from None
        names = [o.name for o in sess.get_outputs()]

        def run_ort(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(zip(names, sess.run(names, feed)))

        # values too, within the FP32 tolerance: a branch or a size the exporter fixed gives the right shapes and
        # the wrong numbers away from the example (the TensorRT targets' host checks run the opt shape only)
        tol = ctx.cfg.tolerance_for("fp32")
        check_values = tol.atol is not None or tol.rtol is not None
        problems, figures = compare_shapes(
            points, probe.feeds, run_ort, probe.references, atol=(tol.atol or 0.0) if check_values else None,
            rtol=tol.rtol or 0.0,
        )  # fmt: skip
        if problems:
            dims = sorted({p.varied for p, f in zip(points, figures.values()) if not f["ok"] and p.varied})
            failing = [p for p, f in zip(points, figures.values()) if not f["ok"]]
            at_example = any(not p.varied and p.label != EDGE_POINT for p in failing)
            values = all("differs from PyTorch" in p for p in problems)
            other = next((e for e in EXPORTER_OPSETS if e != exporter), None)
            if values and all(p.label == EDGE_POINT for p in failing):  # right on draws, wrong at the edges
                raise StageError(
                    self.name,
                    "the exported model computes other values than PyTorch where its inputs sit at their range's "
                    "edges (zeros, both ends of inputs.range, and pairs of them), though it agrees on random "
                    "inputs: an op whose edge cases export otherwise (0/0, the sign of a zero, ties): "
                    + "; ".join(problems[:2]),
                    hint=(f"try export.exporter = '{other}', or " if other else "")
                    + "guard that edge case in the model (torch.where), or narrow inputs.range if such values "
                    "never reach it; where PyTorch's own answer there is arbitrary (tied scores ranked by TopK), "
                    "export.edge_probe = false",
                )
            if at_example and values:  # wrong at the example's own sizes too: no dynamic dim is at fault
                raise StageError(
                    self.name,
                    "the exported model computes other values than PyTorch at the example's own sizes (opt), so "
                    "no dynamic dim is at fault: an op exports with other semantics than PyTorch runs it (a fast "
                    "path PyTorch takes, an op's edge cases): " + "; ".join(problems[:4]),
                    hint=(f"try export.exporter = '{other}' (it exports the ops another way), or " if other else "")
                    + "rewrite the op that differs with ops that export alike",
                )
            where = ", ".join(repr(d) for d in dims) or "at opt"
            raise StageError(
                self.name,
                (
                    f"the exported model computes other values than PyTorch across dynamic dim(s) {where} (a size "
                    "or a branch fixed at export): "
                    if values
                    else f"the exported model does not work across dynamic dim(s) {where} (shape baked at export): "
                )
                + "; ".join(problems[:4]),
                hint="use tensor shapes (x.shape[0], x.size(-1)) instead of Python ints or branches on those dims; "
                "export.exporter = 'dynamo' reports the line that specialises them",
            )
        return {label: f["ok"] for label, f in figures.items()}


def _dims_named(errors: list[str]) -> list[str]:
    """The dynamic dims the exporters' failures name (``axis 0 ('batch') is fixed``, ``dim(s) 'batch'``)."""
    import re

    text = " ".join(errors)
    named = re.findall(r"\('(\w+)'\) is fixed", text)
    for group in re.findall(r"dynamic dim\(s\) ((?:'\w+'(?:, )?)+)", text):
        named += re.findall(r"'(\w+)'", group)
    return list(dict.fromkeys(named))


def _export_fix(ctx: BuildContext, tried: list[str]) -> str:
    """The fixes left for an export every exporter in ``tried`` failed: another exporter only where one was not
    tried, another opset only where the target parses a higher one than was used."""
    fixes = ["see the op or dim named above: replace or rewrite that call in the model"]
    untried = [e for e in EXPORTER_OPSETS if e not in tried]
    if untried:
        fixes.append(f"try export.exporter = {untried[0]!r}")
    used = max(choose_opset(ctx.cfg, ctx.target, e) for e in tried)
    if used < ctx.target.max_opset:
        fixes.append(f"try a higher export.opset (target '{ctx.target.name}' parses up to {ctx.target.max_opset})")
    elif ctx.target.name != "cpu":
        fixes.append(f"opset {used} is the most target '{ctx.target.name}' parses: a newer target may export it")
    return "; or ".join(fixes)


def _order(ctx: BuildContext) -> tuple[list[str], str]:
    """The exporters to try and why that order (``export.exporter = "auto"``: cheapest proven first)."""
    order = exporter_order(ctx.cfg, ctx.target)
    if ctx.cfg.export.exporter != "auto":
        return order, "export.exporter"
    return cheapest_first(order, ctx.metrics.get("capture"))


class _Probe:
    """Probe points (min / opt / max / random per dynamic dim), their inputs and the eager outputs there.

    The points and inputs are the capture stage's; where it ran in this build (``known``: its feeds and eager
    outputs), its outputs are reused after checking the feeds are the same arrays: one eager pass per point.
    """

    def __init__(self, cfg: DeployConfig, model: Any, known: Any = None) -> None:
        import torch

        self.points = probe_points(cfg, seed=cfg.validate.seed + PROBE_SEED)
        self.feeds = probe_feeds(cfg, self.points, seed=cfg.validate.seed + PROBE_SEED)
        if known is not None and _same_feeds(known[0], self.feeds):
            self.references = list(known[1])
            return
        with torch.inference_mode():
            self.references = [outputs_as_numpy(cfg, model(*torch_args(cfg, f))) for f in self.feeds]


def _same_feeds(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b)
    )


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
