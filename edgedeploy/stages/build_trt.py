"""Placeholder build stage for TensorRT targets until the device-bundle builder lands."""

from __future__ import annotations

from typing import Any

from edgedeploy.errors import TargetCapabilityError
from edgedeploy.pipeline.context import BuildContext
from edgedeploy.stages.base import Stage


class BundleFromOnnx(Stage):
    name = "build"

    def run(self, ctx: BuildContext) -> dict[str, Any]:
        raise TargetCapabilityError(
            f"target '{ctx.target.name}' is not buildable yet in this version", hint="use --target cpu"
        )
