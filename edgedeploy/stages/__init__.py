"""Pipeline stages (layer 3): orchestration only, one stage per module, each named by what it makes
from what. ``base`` holds the contract: ``BuildContext`` (the build's state), ``Stage`` and ``StageResult``.

A stage module may import ``base``, domain packages, tools and plain data; never
another stage module, ``pipeline`` or the entry points. This package maps a target to its stages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgedeploy.config import DeployConfig
    from edgedeploy.stages.base import Stage
    from edgedeploy.targets import TargetProfile


def builders() -> dict[str, type[Stage]]:
    """Build stage per registered target runtime (``edgedeploy.runtimes``)."""
    from edgedeploy import runtimes

    return {name: runtimes.load(runtimes.get(name).build_stage) for name in runtimes.names()}


def _builder(runtime: str) -> type[Stage]:
    from edgedeploy import runtimes

    stage: type[Stage] = runtimes.load(runtimes.get(runtime).build_stage)
    return stage


def pipeline_stages(target: TargetProfile, cfg: DeployConfig | None = None) -> list[Stage]:
    """The ordered stages of ``deploy build`` for ``target``; a model given as ONNX (``model.onnx``) is
    taken as it is (no capture, no export) and judged against its own ONNX Runtime FP32 run."""
    from edgedeploy.stages.capture import TorchScriptFromModel
    from edgedeploy.stages.check import PreflightFromOnnx
    from edgedeploy.stages.export import OnnxFromTorch
    from edgedeploy.stages.precision import PrecisionFromOnnx
    from edgedeploy.stages.reference import GoldensFromTorch
    from edgedeploy.stages.validate import ParityFromGoldens

    if cfg is not None and cfg.model.onnx:
        from edgedeploy.stages.export_onnx_file import OnnxFromFile
        from edgedeploy.stages.reference_onnx import GoldensFromOnnx

        return [
            GoldensFromOnnx(),
            OnnxFromFile(),
            PreflightFromOnnx(),
            PrecisionFromOnnx(),
            _builder(target.runtime)(),
            ParityFromGoldens(),
        ]
    return [
        GoldensFromTorch(),
        TorchScriptFromModel(),
        OnnxFromTorch(),
        PreflightFromOnnx(),
        PrecisionFromOnnx(),
        _builder(target.runtime)(),
        ParityFromGoldens(),
    ]
