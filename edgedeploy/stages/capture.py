"""TorchScriptFromModel: capture the eager model (torch.jit.trace / script, or torch.export) and check it.

The captured module is run at min, max and a random size of every dynamic dim (one
dim at a time) and compared with eager, so a shape frozen during capture fails here,
naming the dim. TracerWarnings (Python values frozen into the graph) are reported at
the user's ``file:line`` (the innermost frame outside torch) and fail the stage by
default. The artifact is kept for LibTorch / torch2trt users: ``model.ts`` (trace,
script) or ``model.pt2`` (torch.export, saved with ``torch.export.save``).
"""

from __future__ import annotations

import traceback
import warnings
from typing import Any

import numpy as np

from edgedeploy import stagenames as names
from edgedeploy.artifacts import EXPORTED_PROGRAM, TORCHSCRIPT
from edgedeploy.errors import StageError
from edgedeploy.modelio.inputs import feeds_with_dims
from edgedeploy.modelio.torchutil import outputs_as_numpy, quiet_torch, root_cause, torch_args, user_frame
from edgedeploy.onnxtools.shapes import compare_shapes, example_dims, export_dynamic_shapes, probe_feeds, probe_points
from edgedeploy.stages.base import Stage, model_inputs
from edgedeploy.stages.context import BuildContext

CAPTURE_ATOL = 1e-4


class TorchScriptFromModel(Stage):
    name = names.CAPTURE
    version = "2"
    produces = (TORCHSCRIPT,)

    def outputs(self, ctx: BuildContext) -> tuple[str, ...]:
        return (EXPORTED_PROGRAM,) if ctx.cfg.export.capture == "export" else (TORCHSCRIPT,)

    def inputs(self, ctx: BuildContext) -> tuple[str, ...]:
        return model_inputs(ctx)

    def config_key(self, ctx: BuildContext) -> Any:
        c = ctx.cfg.to_dict()
        return {"model": c["model"], "inputs": c["inputs"], "dims": c["dims"], "export": c["export"]}

    def run(self, ctx: BuildContext) -> dict[str, Any]:
        import torch

        cfg = ctx.cfg
        model = ctx.model()
        mode = cfg.export.capture
        rng = np.random.default_rng(cfg.validate.seed + 1)
        example = torch_args(cfg, feeds_with_dims(cfg, example_dims(cfg), rng))
        with torch.no_grad():
            captured, runner, findings = self._capture(ctx, model, example)
        if findings and cfg.export.fail_on_tracer_warnings:
            raise StageError(
                self.name,
                f"tracing froze Python values into the graph ({len(findings)} TracerWarning(s)): "
                + " | ".join(findings[:3])
                + (f" (+{len(findings) - 3} more)" if len(findings) > 3 else ""),
                hint="make the model shape-agnostic at those lines (x.shape[0] instead of int(...)), "
                'use capture = "script" or "export", or set export.fail_on_tracer_warnings = false',
            )
        for w in findings:
            ctx.warn(f"TracerWarning at {w}")
        points = probe_points(cfg, seed=cfg.validate.seed + 1)
        feeds = probe_feeds(cfg, points, seed=cfg.validate.seed + 1)

        def run_with(fn: Any) -> Any:
            def call(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                # the graph as captured: TorchScript's per-shape profiling / fusion passes only cost time here
                with torch.inference_mode(), torch.jit.optimized_execution(False):
                    return outputs_as_numpy(cfg, fn(*torch_args(cfg, feed)))

            return call

        eager = run_with(model)
        problems, figures = compare_shapes(
            points, feeds, run_with(runner), [eager(f) for f in feeds], atol=CAPTURE_ATOL
        )
        if problems:
            raise StageError(
                self.name,
                f"the {mode} capture differs from eager PyTorch: " + "; ".join(problems[:4]),
                hint="a shape or a Python value was frozen during capture; make the code at those dims "
                'shape-agnostic or try capture = "script" / "export"',
            )
        out = ctx.staging / self.outputs(ctx)[0]
        if mode == "export":
            torch.export.save(captured, str(out))
        else:
            captured.save(str(out))
        return {
            "mode": mode,
            "artifact": out.name,
            "points": figures,
            "max_abs_vs_eager": max((f.get("max_abs", 0.0) for f in figures.values()), default=0.0),
            "tracer_warnings": findings,
        }

    def _capture(self, ctx: BuildContext, model: Any, example: tuple[Any, ...]) -> tuple[Any, Any, list[str]]:
        """(artifact object, callable that runs it, TracerWarnings as 'file:line: message')."""
        import torch

        mode = ctx.cfg.export.capture
        findings: list[str] = []

        def record(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            if issubclass(category, torch.jit.TracerWarning):
                where = user_frame(traceback.extract_stack()[:-1]) or f"{filename}:{lineno}"
                text = f"{where}: {' '.join(str(message).split())[:200]}"
                if text not in findings:
                    findings.append(text)

        with warnings.catch_warnings():
            warnings.simplefilter("always", torch.jit.TracerWarning)
            warnings.showwarning = record
            try:
                if mode == "script":
                    captured = torch.jit.script(model)
                    return captured, captured, findings
                if mode == "export":
                    with quiet_torch():
                        ep = torch.export.export(model, example, dynamic_shapes=export_dynamic_shapes(ctx.cfg))
                    return ep, ep.module(), findings
                # strict=False: dict / list outputs (segmentation heads) are flattened onto the output names
                captured = torch.jit.trace(model, example, check_trace=False, strict=False)
                return captured, captured, findings
            except Exception as exc:  # capture errors come from the user's model code
                raise StageError(
                    self.name,
                    f"{_api(mode)} failed: {root_cause(exc, 400)}",
                    hint="a dim named in the message was specialised: make that code shape-agnostic, "
                    'or try capture = "trace"'
                    if mode == "export"
                    else 'try capture = "trace" or "export"',
                ) from None


def _api(mode: str) -> str:
    return {"trace": "torch.jit.trace", "script": "torch.jit.script", "export": "torch.export.export"}[mode]
