"""OrtModelFromOnnx: the cpu target's artifact, an ONNX model proven to load in ONNX Runtime."""

from __future__ import annotations

import json
from typing import Any

from edgedeploy import stagenames as names
from edgedeploy.artifacts import ONNX_DATA, RUNTIME_INFO, deploy_model_name
from edgedeploy.onnxtools.ort import ort_session
from edgedeploy.stages.base import BuildContext, Stage


class OrtModelFromOnnx(Stage):
    name = names.BUILD
    version = "1"
    optional = (ONNX_DATA,)  # the FP32 model's external weights, when export wrote them
    produces = (RUNTIME_INFO,)

    def requires(self, ctx: BuildContext) -> tuple[str, ...]:
        return (deploy_model_name(ctx.precision),)

    def config_key(self, ctx: BuildContext) -> Any:
        return {"precision": ctx.precision, "target": ctx.target.name}

    def run(self, ctx: BuildContext) -> dict[str, Any]:
        import onnxruntime as ort

        model = deploy_model_name(ctx.precision)
        sess = ort_session(str(ctx.path(model)))
        info = {
            "runtime": "onnxruntime",
            "onnxruntime": ort.__version__,
            "providers": sess.get_providers(),
            "model": model,
            "precision": ctx.precision,
            "inputs": [{"name": i.name, "shape": i.shape, "type": i.type} for i in sess.get_inputs()],
            "outputs": [{"name": o.name, "shape": o.shape, "type": o.type} for o in sess.get_outputs()],
        }
        (ctx.staging / RUNTIME_INFO).write_text(json.dumps(info, indent=2))
        return {"artifact": model, "providers": info["providers"]}
