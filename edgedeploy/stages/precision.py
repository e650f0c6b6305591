"""Precision conversion of the ONNX model (FP16 / INT8); FP32 builds skip this stage."""

from __future__ import annotations

from typing import Any

from edgedeploy.errors import TargetCapabilityError
from edgedeploy.pipeline.context import BuildContext
from edgedeploy.stages.base import Stage
from edgedeploy.stages.export import ONNX_MODEL

PRECISION_MODELS = {"fp32": ONNX_MODEL, "fp16": "model.fp16.onnx", "int8": "model.int8.onnx"}


def deploy_model_name(precision: str) -> str:
    """The ONNX file the build stage turns into the artifact for ``precision``."""
    return PRECISION_MODELS[precision]


class PrecisionFromOnnx(Stage):
    name = "precision"
    version = "1"
    consumes = (ONNX_MODEL,)

    def applies(self, ctx: BuildContext) -> str | None:
        return "fp32: nothing to convert" if ctx.precision == "fp32" else None

    def outputs(self, ctx: BuildContext) -> tuple[str, ...]:
        return (deploy_model_name(ctx.precision),)

    def run(self, ctx: BuildContext) -> dict[str, Any]:
        raise TargetCapabilityError(f"precision {ctx.precision} is not implemented yet for target {ctx.target.name}")
