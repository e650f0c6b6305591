"""TorchScriptFromModel: capture the eager model (torch.jit.trace / script, or torch.export) and check it.

``capture = "auto"`` (default) tries trace, torch.export, script in turn and keeps the first whose
program matches eager at min, max and a random size of every dynamic dim (one dim at a time);
the report records the route and why each earlier one failed. An explicit route means exactly
that route. TracerWarnings raised at the user's own lines are reported at their ``file:line``
and fail trace by default; those raised inside library code (nn.LSTM, transformers) are recorded
and left to the shape probes to judge. The artifact is kept for LibTorch / torch2trt users:
``model.ts`` (trace, script) or ``model.pt2`` (torch.export, saved with ``torch.export.save``).

For a target whose engine is built on the device, ``auto`` tries the trace route alone: a bundle carries only
ONNX, so the trace's use is to prove tracing safe, which lets ``exporter = "auto"`` take the cheaper TorchScript
exporter; a trace that fails there is recorded, not an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from edgedeploy import stagenames as names
from edgedeploy.artifacts import TORCHSCRIPT
from edgedeploy.errors import StageError
from edgedeploy.modelio.capture import API, ARTIFACTS, capture_route, route_order, save_artifact
from edgedeploy.modelio.goldens import NOT_DETERMINISTIC_FIX, not_deterministic
from edgedeploy.modelio.inputs import feeds_with_dims
from edgedeploy.modelio.torchutil import outputs_as_numpy, root_cause, torch_args
from edgedeploy.onnxtools.shapes import (
    PROBE_SEED,
    compare_shapes,
    example_dims,
    export_dynamic_shapes,
    probe_feeds,
    probe_points,
)
from edgedeploy.stages.base import BuildContext, Stage, StageResult, model_inputs

if TYPE_CHECKING:
    from edgedeploy.config import DeployConfig

CAPTURE_ATOL = 1e-4


class TorchScriptFromModel(Stage):
    name = names.CAPTURE
    # 4: a factory without checkpoint builds its weights from a fixed seed; 5: a probe at the inputs' range edges
    version = "5"
    produces = (TORCHSCRIPT,)

    def __init__(self) -> None:
        self._artifact: str | None = None  # set by run(): auto only knows its route afterwards

    def applies(self, ctx: BuildContext) -> str | None:
        if self._probe_only(ctx) and ctx.cfg.export.exporter != "auto":
            # a device bundle carries only ONNX and validation runs there: the trace's one use here is to let
            # exporter = auto take the cheaper exporter
            return "nothing here consumes a TorchScript program for this target (export.capture = auto)"
        return None

    @staticmethod
    def _probe_only(ctx: BuildContext) -> bool:
        """A target whose engine is built on the device, with ``capture = "auto"``: only the trace route is
        tried, to prove tracing safe for the export stage (:func:`edgedeploy.onnxtools.export.cheapest_first`);
        when it fails the build goes on with the exporter that emits the opset natively."""
        return ctx.cfg.export.capture == "auto" and not ctx.target.builds_here

    def outputs(self, ctx: BuildContext) -> tuple[str, ...]:
        if self._artifact is not None:  # after run(); "" when the capture could not be saved
            return (self._artifact,) if self._artifact else ()
        return (ARTIFACTS[ctx.cfg.export.capture],) if ctx.cfg.export.capture != "auto" else (TORCHSCRIPT,)

    def inputs(self, ctx: BuildContext) -> tuple[str, ...]:
        return model_inputs(ctx)

    def config_key(self, ctx: BuildContext) -> Any:
        c = ctx.cfg.to_dict()
        key = {"model": c["model"], "inputs": c["inputs"], "dims": c["dims"], "export": c["export"]}
        key["probe_seed"] = ctx.cfg.validate.seed  # the probe points' random sizes and inputs
        if self._probe_only(ctx):  # a failed trace passes here but fails a cpu build: not one cache entry
            key["probe_only"] = True
        return key

    def run(self, ctx: BuildContext) -> StageResult:
        cfg = ctx.cfg
        model = ctx.model()
        mode = cfg.export.capture
        rng = np.random.default_rng(cfg.validate.seed + 1)
        example = torch_args(cfg, feeds_with_dims(cfg, example_dims(cfg), rng))
        points = probe_points(cfg, seed=cfg.validate.seed + PROBE_SEED)
        feeds = probe_feeds(cfg, points, seed=cfg.validate.seed + PROBE_SEED)
        eager = _eager_at_points(cfg, model, points, feeds)
        ctx.probe_outputs = (feeds, eager)  # the export stage probes the same points: one eager pass each
        probe_only = self._probe_only(ctx)
        order = ("trace",) if probe_only else route_order(mode)
        tried: list[dict[str, str]] = []
        for route in order:
            try:
                captured, figures, findings = self._try(ctx, route, model, example, points, feeds, eager)
            except StageError as exc:
                if len(order) == 1 and not probe_only:
                    raise
                tried.append({"route": route, "reason": exc.message.removeprefix(f"[{self.name}] ")})
                continue
            self._artifact = ARTIFACTS[route]
            warnings: list[str] = []
            try:
                save_artifact(route, captured, str(ctx.staging / self._artifact))
            except Exception as exc:  # e.g. torch.export.save cannot serialise some higher-order ops
                # the capture is proven against eager; only its file for LibTorch users is lost
                (ctx.staging / self._artifact).unlink(missing_ok=True)
                why = root_cause(exc, 200)
                warnings.append(f"capture: {route} matches eager but its {self._artifact} cannot be saved ({why})")
                self._artifact = ""
            for f in findings:
                if f.user:  # library findings are in the metrics; the probes above already judged them
                    warnings.append(f"TracerWarning at {f}")
            if tried:
                warnings.append(
                    f"capture: used {route} ({'; '.join(t['route'] + ': ' + t['reason'][:160] for t in tried)})"
                )
            metrics = {
                "mode": mode,
                "route": route,
                "tried": tried,
                "artifact": self._artifact or None,
                "points": figures,
                "max_abs_vs_eager": max((f.get("max_abs", 0.0) for f in figures.values()), default=0.0),
                "tracer_warnings": [str(f) for f in findings],
                "tracer_warnings_library": sum(not f.user for f in findings),
            }
            return StageResult(metrics, warnings=warnings)
        if probe_only:  # nothing here needs the program: the export stage keeps its own order
            self._artifact = ""
            why = "tracing not proven for this model: the export stage keeps the exporter that emits the opset"
            return StageResult({"mode": mode, "route": None, "tried": tried, "artifact": None, "why": why})
        moving = not_deterministic(model, cfg, feeds[0], eager[0], CAPTURE_ATOL)
        if moving:  # no route can match a reference that moves: that is the one line
            raise StageError(self.name, f"eager PyTorch is not deterministic: {moving}", hint=NOT_DETERMINISTIC_FIX)
        raise StageError(
            self.name,
            "no capture route matches eager PyTorch: "
            + " | ".join(f"{t['route']}: {t['reason'][:300]}" for t in tried),
            hint="fix the first route's problem (usually trace: the line named), "
            "or set export.capture to one route to see its full error",
        )

    def _try(
        self,
        ctx: BuildContext,
        route: str,
        model: Any,
        example: tuple[Any, ...],
        points: list[Any],
        feeds: list[dict[str, np.ndarray]],
        eager: list[dict[str, np.ndarray]],
    ) -> tuple[Any, dict[str, Any], list[Any]]:
        """Capture one way and probe it against eager; return (artifact, per-point figures, TracerWarnings).

        Raises:
            StageError: the capture API failed, the user's code froze values (TracerWarnings at
                their lines), or the captured program differs from eager at some probe point.
        """
        cfg = ctx.cfg
        try:
            # only torch.export takes Dims (building them imports sympy: seconds, for trace and script nothing)
            shapes = export_dynamic_shapes(cfg) if route == "export" else None
            captured, runner, tw = capture_route(route, model, example, shapes)
        except Exception as exc:  # capture errors come from the user's model code
            raise StageError(
                self.name,
                f"{API[route]} failed: {root_cause(exc, 400)}",
                hint="a dim named in the message was specialised: make that code shape-agnostic, "
                'or try capture = "trace"'
                if route == "export"
                else 'try capture = "trace" or "export"',
            ) from None
        user = tw.user
        if user and cfg.export.fail_on_tracer_warnings:
            raise StageError(
                self.name,
                f"tracing froze Python values into the graph ({len(user)} TracerWarning(s) in your code): "
                + " | ".join(str(f) for f in user[:3])
                + (f" (+{len(user) - 3} more)" if len(user) > 3 else ""),
                hint="make the model shape-agnostic at those lines (x.shape[0] instead of int(...)), "
                'use capture = "script" or "export", or set export.fail_on_tracer_warnings = false',
            )
        problems, figures = compare_shapes(points, feeds, _run_with(cfg, runner), eager, atol=CAPTURE_ATOL)
        if problems:
            lib = tw.library
            why = f" ({len(lib)} TracerWarning(s) in library code, e.g. {lib[0]})" if lib else ""
            raise StageError(
                self.name,
                f"the {route} capture differs from eager PyTorch: " + "; ".join(problems[:4]) + why,
                hint="a shape or a Python value was frozen during capture; make the code at those dims "
                'shape-agnostic or try capture = "script" / "export"',
            )
        return captured, figures, tw.findings


def _eager_at_points(
    cfg: DeployConfig, model: Any, points: list[Any], feeds: list[dict[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    """The eager model's outputs at each probe point.

    Raises:
        StageError: the model itself fails at a point (a size inside the declared [dims] range it does not
            accept, e.g. a length that is not a multiple of its frame size): named, with the dim to fix.
    """
    run = _run_with(cfg, model)
    outputs = []
    for point, feed in zip(points, feeds):
        try:
            outputs.append(run(feed))
        except Exception as exc:  # the user's model code, on an input the config says it accepts
            dim = point.varied
            sizes = ", ".join(f"{k}={v}" for k, v in point.dims.items())
            shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feed.items())
            raise StageError(
                names.CAPTURE,
                f"the PyTorch model fails at probe point {point.label} ({sizes}; inputs {shapes}): "
                f"{root_cause(exc, 300)}",
                hint=(
                    f"every size in [dims.{dim}] min..max must work: make the model accept {dim}={point.dims[dim]} "
                    "(e.g. pad inside forward to the size it needs), "
                    f"or set [dims.{dim}] min = opt = max to a size it accepts"
                )
                if dim
                else "fix the model so it runs on inputs of the declared shapes, dtypes and inputs.range",
            ) from None
    return outputs


def _run_with(cfg: DeployConfig, fn: Any) -> Any:
    def call(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        # the graph as captured: TorchScript's per-shape profiling / fusion passes only cost time here
        with torch.inference_mode(), torch.jit.optimized_execution(False):
            return outputs_as_numpy(cfg, fn(*torch_args(cfg, feed)))

    return call
