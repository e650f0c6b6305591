"""GoldensFromTorch: seeded inputs at min/opt/max and the PyTorch model's outputs, saved as goldens.npz.

Every later comparison (ONNX Runtime here, TensorRT on the device) reads these
files, so validation needs no torch once the goldens exist. Which inputs go in, and how goldens.npz is kept
within ``validate.goldens_budget_mb``: ``edgedeploy.precision.golden_feeds``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgedeploy import stagenames as names
from edgedeploy.artifacts import CALIB_CODE, GOLDENS, VALIDATION_DATA
from edgedeploy.errors import StageError
from edgedeploy.modelio.goldens import torch_outputs
from edgedeploy.modelio.torchutil import root_cause
from edgedeploy.precision.golden_feeds import budget_bytes, check_finite, golden_arrays, goldens_config_key
from edgedeploy.stages.base import BuildContext, Stage, StageResult, model_inputs


class GoldensFromTorch(Stage):
    name = names.REFERENCE
    # 4: float32 inputs that are float16 values stored as float16 (``half``)
    # 5: a factory without checkpoint builds its weights from a fixed seed (entries of unseeded ones differ)
    version = "6"  # 6: masks without a full-length row in about half the draws; eager runs on input copies
    produces = (GOLDENS,)

    def inputs(self, ctx: BuildContext) -> tuple[str, ...]:
        # the held-out calibration batches go into the goldens: a calibration callable's code is an input too
        extra = (VALIDATION_DATA, CALIB_CODE)
        return model_inputs(ctx) + tuple(name for name in extra if ctx.has_input(name))

    def config_key(self, ctx: BuildContext) -> Any:
        return goldens_config_key(ctx.cfg)

    def run(self, ctx: BuildContext) -> StageResult:
        cfg = ctx.cfg
        ctx.status("loading the PyTorch model" + (" (Hugging Face from_pretrained)" if cfg.model.hf else ""))
        model = ctx.model()
        weights = sum(int(t.numel()) * t.element_size() for t in [*model.parameters(), *model.buffers()])
        budget = budget_bytes(cfg, weights)

        def outputs(feeds: dict[str, np.ndarray], done: int, total: int, point: str) -> dict[str, np.ndarray]:
            ctx.status(f"PyTorch reference outputs: batch {done} of {total} ({point})", tick=True)
            try:
                return torch_outputs(model, cfg, feeds)
            except Exception as exc:  # the user's model code, on an input the config declares
                shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
                raise StageError(
                    self.name,
                    f"the PyTorch model fails on the {point} goldens (inputs {shapes}): {root_cause(exc, 300)}",
                    hint="make the model accept every shape the [dims] ranges declare (min, opt, max), "
                    "or change [dims] to sizes it accepts",
                ) from None

        arrays, metrics, warnings = golden_arrays(cfg, outputs, budget)
        # numpy's stubs type **kwds against its own allow_pickle flag; these are all arrays
        np.savez(ctx.staging / GOLDENS, **arrays)  # type: ignore[arg-type]
        check_finite(arrays, self.name, "PyTorch model")
        result = StageResult(metrics)
        result.warnings.extend(warnings)
        return result
