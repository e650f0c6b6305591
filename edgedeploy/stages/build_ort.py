"""OrtModelFromOnnx: the cpu target's artifact, an ONNX model proven to load in ONNX Runtime."""

from __future__ import annotations

import json
from typing import Any

from edgedeploy.errors import StageError
from edgedeploy.pipeline.context import BuildContext
from edgedeploy.stages.base import Stage
from edgedeploy.stages.precision import PRECISION_MODELS, deploy_model_name

RUNTIME_INFO = "runtime.json"


def ort_session(path: str, *, threads: int | None = None) -> Any:
    """A CPU ONNX Runtime session for ``path`` (all graph optimizations on).

    Raises:
        StageError: ONNX Runtime refuses the model.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped exceptions
        raise StageError("build", f"ONNX Runtime cannot load {path}: {' '.join(str(exc).split())[:300]}") from None


class OrtModelFromOnnx(Stage):
    name = "build"
    version = "1"
    consumes = tuple(dict.fromkeys(PRECISION_MODELS.values()))
    produces = (RUNTIME_INFO,)

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
