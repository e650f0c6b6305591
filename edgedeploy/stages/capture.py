"""TorchScriptFromModel: capture the eager model with torch.jit.trace and check the capture.

The trace is checked on inputs whose dynamic dims differ from the example's, and
TracerWarnings (Python values frozen into the graph) fail the stage by default.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from edgedeploy.errors import StageError
from edgedeploy.pipeline.context import BuildContext
from edgedeploy.stages.base import Stage
from edgedeploy.stages.inputs import feeds_at

TORCHSCRIPT = "model.ts"


def torch_args(cfg: Any, feeds: dict[str, np.ndarray]) -> tuple[Any, ...]:
    import torch

    return tuple(torch.from_numpy(np.ascontiguousarray(feeds[s.name])) for s in cfg.inputs)


def max_abs_diff(a: Any, b: Any) -> float:
    from edgedeploy.stages.reference import _flatten

    fa, fb = _flatten(a), _flatten(b)
    if len(fa) != len(fb):
        return float("inf")
    worst = 0.0
    for x, y in zip(fa, fb):
        if tuple(x.shape) != tuple(y.shape):
            return float("inf")
        if x.numel():
            worst = max(worst, float((x.float() - y.float()).abs().max()))
    return worst


class TorchScriptFromModel(Stage):
    name = "capture"
    version = "1"
    consumes = ("checkpoint", "model_code")
    produces = (TORCHSCRIPT,)

    def config_key(self, ctx: BuildContext) -> Any:
        c = ctx.cfg.to_dict()
        return {"model": c["model"], "inputs": c["inputs"], "dims": c["dims"], "export": c["export"]}

    def run(self, ctx: BuildContext) -> dict[str, Any]:
        import torch

        cfg = ctx.cfg
        model = ctx.model()
        rng = np.random.default_rng(cfg.validate.seed + 1)
        example = torch_args(cfg, feeds_at(cfg, "opt", rng))
        checks = [torch_args(cfg, feeds_at(cfg, p, rng)) for p in ("min", "max")]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", torch.jit.TracerWarning)
            try:
                if cfg.export.capture == "script":
                    captured = torch.jit.script(model)
                else:
                    captured = torch.jit.trace(model, example, check_trace=False)
            except Exception as exc:  # tracing/scripting errors come from the user's model code
                raise StageError(
                    self.name,
                    f"torch.jit.{cfg.export.capture} failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
                ) from None
        tracer = [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
        findings = [f"{w.filename}:{w.lineno}: {' '.join(str(w.message).split())[:200]}" for w in tracer]
        if findings and cfg.export.fail_on_tracer_warnings:
            raise StageError(
                self.name,
                f"tracing froze Python values into the graph ({len(findings)} warnings): " + " | ".join(findings[:3]),
                hint='make the model shape-agnostic at those lines, use capture = "script", or '
                "set export.fail_on_tracer_warnings = false",
            )
        for w in findings:
            ctx.warn(f"TracerWarning {w}")
        errors = {}
        with torch.inference_mode():
            for label, args in zip(("opt", "min", "max"), (example, *checks)):
                errors[label] = max_abs_diff(model(*args), captured(*args))
        bad = {k: v for k, v in errors.items() if not v <= 1e-4}
        if bad:
            raise StageError(
                self.name,
                "captured module differs from eager at "
                + ", ".join(f"{k} shape (max abs {v:.3g})" for k, v in bad.items()),
                hint='a shape or control-flow value was frozen during capture; try capture = "script"',
            )
        captured.save(str(ctx.staging / TORCHSCRIPT))
        return {"mode": cfg.export.capture, "max_abs_vs_eager": errors, "tracer_warnings": findings}
