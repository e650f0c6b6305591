"""PreflightFromOnnx: check every node of the ONNX model against what the target runtime runs.

TensorRT targets: the op table of the target's TensorRT version (data, no TensorRT).
cpu: an ONNX Runtime session. All findings are reported at once; errors stop the build
before any expensive stage (UnsupportedOpsError, exit code 5), warnings go to the report.
"""

from __future__ import annotations

import json
from typing import Any

from edgedeploy import stagenames as names
from edgedeploy.artifacts import ONNX_DATA, ONNX_MODEL, PREFLIGHT
from edgedeploy.errors import UnsupportedOpsError
from edgedeploy.onnxtools.opsupport import check_model, findings_table, module_files, raise_on_errors
from edgedeploy.stages.base import BuildContext, Stage, StageResult


class PreflightFromOnnx(Stage):
    name = names.CHECK
    # 3: a missing op's fix names the TensorRT release that parses it
    # 4: If / Loop bodies checked; the table restrictions the parser enforces are errors; the opset floor
    version = "4"
    consumes = (ONNX_MODEL,)
    optional = (ONNX_DATA,)
    produces = (PREFLIGHT,)

    def config_key(self, ctx: BuildContext) -> Any:
        return {"target": ctx.target.capabilities(), "dla": ctx.cfg.build.dla_core, "precision": ctx.precision}

    def run(self, ctx: BuildContext) -> StageResult | dict[str, Any]:
        path = ctx.path(ONNX_MODEL)
        findings = check_model(path, ctx.target, dla_core=ctx.cfg.build.dla_core, precision=ctx.precision)
        if ctx.cfg.model.factory and any(f.severity != "info" and f.op and not f.source for f in findings):
            # TorchScript-exporter scopes name modules; map them to their files for the report
            modules = module_files(ctx.model())
            findings = check_model(
                path, ctx.target, dla_core=ctx.cfg.build.dla_core, precision=ctx.precision, module_paths=modules
            )
        rows = [f.to_dict() for f in findings]
        (ctx.staging / PREFLIGHT).write_text(json.dumps({"target": ctx.target.name, "findings": rows}, indent=2))
        counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "info")}
        metrics = {"findings": rows, **counts}
        if ctx.log and (counts["error"] or counts["warning"]):
            ctx.log(findings_table(findings))
        elif ctx.log and counts["info"]:
            ctx.log(f"  check: {counts['info']} restriction note(s) to review in {PREFLIGHT}")
        try:
            raise_on_errors(findings, ctx.target.name)
        except UnsupportedOpsError as exc:
            exc.partial = StageResult(metrics)
            raise
        warnings = [
            f"check: {f.op + ' ' if f.op else ''}{f.node + ': ' if f.node else ''}{f.message}"
            for f in findings
            if f.severity == "warning"
        ]
        return StageResult(metrics, warnings=warnings)
