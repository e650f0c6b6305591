"""PreflightFromOnnx: check every node of the ONNX model against what the target runtime runs."""

from __future__ import annotations

from typing import Any

from edgedeploy.errors import UnsupportedOpsError
from edgedeploy.pipeline.context import BuildContext
from edgedeploy.stages.base import Stage
from edgedeploy.stages.export import ONNX_MODEL

PREFLIGHT = "preflight.json"


def onnxruntime_findings(model_path: str) -> list[dict[str, Any]]:
    """Nodes whose (domain, op) ONNX Runtime's CPU provider has no kernel for, found by creating a session."""
    import onnxruntime as ort

    try:
        ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    except Exception as exc:  # NOT_IMPLEMENTED / INVALID_GRAPH from the runtime
        return [
            {
                "node": "",
                "op": "",
                "severity": "error",
                "message": " ".join(str(exc).split())[:300],
                "fix": "change the op in the model or pick another opset",
            }
        ]
    return []


class PreflightFromOnnx(Stage):
    name = "check"
    version = "1"
    consumes = (ONNX_MODEL,)
    produces = (PREFLIGHT,)

    def config_key(self, ctx: BuildContext) -> Any:
        return {"target": ctx.target.capabilities(), "dla": ctx.cfg.build.dla_core}

    def run(self, ctx: BuildContext) -> dict[str, Any]:
        import json

        findings = onnxruntime_findings(str(ctx.path(ONNX_MODEL))) if ctx.target.runtime == "onnxruntime" else []
        (ctx.staging / PREFLIGHT).write_text(json.dumps({"target": ctx.target.name, "findings": findings}, indent=2))
        errors = [f for f in findings if f["severity"] == "error"]
        if errors:
            raise UnsupportedOpsError(
                f"{len(errors)} unsupported operator(s) for target '{ctx.target.name}': "
                + "; ".join(f"{f['node']} {f['op']}: {f['message']}" for f in errors),
                findings=findings,
            )
        return {"findings": findings, "errors": 0, "warnings": len(findings)}
