"""GoldensFromOnnx: for a model given as ONNX (``model.onnx``), the goldens' reference outputs come from
ONNX Runtime running that model in FP32, since there is no PyTorch model to ask.

The same inputs as GoldensFromTorch (``edgedeploy.precision.golden_feeds``); every later check (FP16 / INT8
variants, the built artifact, TensorRT on the device) is judged against this run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgedeploy import stagenames as names
from edgedeploy.artifacts import CALIB_CODE, CHECKPOINT, GOLDENS, MODEL_CODE, VALIDATION_DATA
from edgedeploy.errors import StageError
from edgedeploy.onnxtools.opsupport import onnxruntime_findings, raise_on_errors
from edgedeploy.onnxtools.ort import ort_session
from edgedeploy.precision.golden_feeds import budget_bytes, check_finite, golden_arrays, goldens_config_key
from edgedeploy.stages.base import BuildContext, Stage, StageResult

# what the parity stage names as the reference of a build from an ONNX model
ONNX_REFERENCE = "onnxruntime-fp32 (the given ONNX model)"


class GoldensFromOnnx(Stage):
    name = names.REFERENCE
    # 3: float32 inputs that are float16 values stored as float16 (``half``); 4: masks without a full-length row
    # in about half the draws
    version = "4"
    produces = (GOLDENS,)

    def inputs(self, ctx: BuildContext) -> tuple[str, ...]:
        return (CHECKPOINT,) + tuple(n for n in (MODEL_CODE, VALIDATION_DATA, CALIB_CODE) if ctx.has_input(n))

    def config_key(self, ctx: BuildContext) -> Any:
        return goldens_config_key(ctx.cfg)

    def run(self, ctx: BuildContext) -> StageResult:
        cfg = ctx.cfg
        budget = budget_bytes(cfg, ctx.path(CHECKPOINT).stat().st_size)  # the ONNX file: its weights and graph
        try:
            session = ort_session(ctx.path(CHECKPOINT), stage=self.name)
        except StageError:
            # the runtime refused the model itself: name the node and op as the preflight would (exit 5)
            raise_on_errors(onnxruntime_findings(ctx.path(CHECKPOINT)), "ONNX Runtime (the reference run)")
            raise

        def outputs(feeds: dict[str, np.ndarray], done: int, total: int, point: str) -> dict[str, np.ndarray]:
            ctx.status(f"ONNX Runtime reference outputs: batch {done} of {total} ({point})", tick=True)
            values = session.run(None, {s.name: feeds[s.name] for s in cfg.inputs})
            return dict(zip(cfg.outputs, values))

        arrays, metrics, warnings = golden_arrays(cfg, outputs, budget)
        np.savez(ctx.staging / GOLDENS, **arrays)  # type: ignore[arg-type]
        check_finite(arrays, self.name, "ONNX model")
        result = StageResult({**metrics, "reference": ONNX_REFERENCE})
        result.warnings.extend(warnings)
        return result
