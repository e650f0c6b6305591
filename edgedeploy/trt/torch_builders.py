"""Optional executors of a build plan from the PyTorch model: Torch-TensorRT and torch2trt.

For desktops where torch, a GPU and one of these libraries are installed (Jetson bundles use the
ONNX route and need no torch). Both are imported lazily; a missing one is a clear error. They
take the same plan as the ONNX route, so shapes, precision and workspace agree.
"""

from __future__ import annotations

from typing import Any

from edgedeploy.errors import StageError, TargetCapabilityError
from edgedeploy.trt.plan import BuildPlan

_TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8"}


def _require(module: str, pip: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise StageError("build", f"{module} is not installed ({exc})", hint=f"pip install {pip}") from None


def torch_tensorrt_settings(plan: BuildPlan) -> dict[str, Any]:
    """Keyword arguments for ``torch_tensorrt.compile`` equivalent to ``plan`` (plain data).

    Raises:
        TargetCapabilityError: INT8 from a calibration cache, which Torch-TensorRT cannot replay.
    """
    if plan.strategy == "int8-calib-cache":
        raise TargetCapabilityError(
            "Torch-TensorRT cannot build from a TensorRT calibration cache",
            hint="use the ONNX route (complete_bundle.py) or a Q/DQ model",
        )
    if plan.precision == "int8":
        # The plan's INT8 lives in the Q/DQ ONNX model; Torch-TensorRT compiles the PyTorch model,
        # which has no quantization, so enabled_precisions={float32} would build an FP32 engine
        # labelled int8. Never downgrade silently.
        raise TargetCapabilityError(
            f"Torch-TensorRT cannot build the plan's INT8 ({plan.strategy}): it compiles the unquantized "
            "PyTorch model, which would give an FP32 engine",
            hint="build INT8 with the ONNX route (complete_bundle.py), or quantize the PyTorch model "
            "(NVIDIA ModelOpt) before compiling",
        )
    precisions = ["float32"] + (["float16"] if plan.precision == "fp16" else [])
    return {
        "inputs": [{"min_shape": i.min, "opt_shape": i.opt, "max_shape": i.max, "name": i.name} for i in plan.inputs],
        "enabled_precisions": precisions,
        "workspace_size": plan.workspace_mib << 20,
        "optimization_level": plan.optimization_level,
        "dla_core": plan.dla_core,
        "allow_gpu_fallback": plan.gpu_fallback,
    }


def build_with_torch_tensorrt(model: Any, plan: BuildPlan) -> Any:
    """Compile ``model`` with Torch-TensorRT following ``plan``; returns the compiled module.

    Raises:
        StageError: torch_tensorrt is not installed or the compile fails.
        TargetCapabilityError: see :func:`torch_tensorrt_settings`.
    """
    settings = torch_tensorrt_settings(plan)
    tt = _require("torch_tensorrt", "torch-tensorrt")
    import torch

    dtypes = {"float32": torch.float32, "float16": torch.float16}
    inputs = [
        tt.Input(min_shape=i["min_shape"], opt_shape=i["opt_shape"], max_shape=i["max_shape"], dtype=torch.float32)
        for i in settings.pop("inputs")
    ]
    precisions = {dtypes[p] for p in settings.pop("enabled_precisions")}
    dla = settings.pop("dla_core")
    device = tt.Device(dla_core=dla, allow_gpu_fallback=settings.pop("allow_gpu_fallback")) if dla is not None else None
    try:
        return tt.compile(
            model, inputs=inputs, enabled_precisions=precisions, **({"device": device} if device else {}), **settings
        )
    except Exception as exc:  # Torch-TensorRT raises many untyped errors
        raise StageError("build", f"Torch-TensorRT compile failed: {' '.join(str(exc).split())[:300]}") from None


def torch2trt_settings(plan: BuildPlan) -> dict[str, Any]:
    """Keyword arguments for ``torch2trt.torch2trt`` equivalent to ``plan`` (plain data; the DLA device
    type is named, ``"DLA"``, and turned into ``trt.DeviceType.DLA`` where TensorRT is imported).

    torch2trt (master since 2024-05, TensorRT 10 support) builds with ``build_serialized_network`` on
    TensorRT >= 10 and ``build_engine`` before; it applies ``max_workspace_size`` only before 10 (on 10
    the workspace is TensorRT's default: the whole device memory). DLA it supports with static shapes
    (``default_device_type``, ``dla_core``, ``gpu_fallback``), which a DLA plan has.

    Raises:
        StageError: INT8, which torch2trt would calibrate on the example input alone.
    """
    if plan.precision == "int8":
        raise StageError(
            "build",
            "torch2trt would calibrate INT8 on the example input alone (it cannot replay the bundle's "
            "calibration cache or read a Q/DQ model)",
            hint="use the ONNX route (complete_bundle.py) for INT8",
        )
    settings: dict[str, Any] = {
        "fp16_mode": plan.precision == "fp16",
        "max_workspace_size": plan.workspace_mib << 20,
        "min_shapes": [tuple(i.min) for i in plan.inputs],
        "opt_shapes": [tuple(i.opt) for i in plan.inputs],
        "max_shapes": [tuple(i.max) for i in plan.inputs],
    }
    if plan.dla_core is not None:
        settings.update(default_device_type="DLA", dla_core=int(plan.dla_core), gpu_fallback=bool(plan.gpu_fallback))
    return settings


def build_with_torch2trt(model: Any, plan: BuildPlan, example: list[Any]) -> Any:
    """Convert ``model`` with torch2trt at the plan's min / opt / max shapes; returns the TRTModule.

    Raises:
        StageError: torch2trt is not installed, the plan needs what torch2trt cannot do (INT8), or
            the conversion failed.
    """
    settings = torch2trt_settings(plan)
    t2t = _require("torch2trt", "torch2trt (from github.com/NVIDIA-AI-IOT/torch2trt)")
    if settings.get("default_device_type") == "DLA":
        import tensorrt as trt

        settings["default_device_type"] = trt.DeviceType.DLA
    try:
        return t2t.torch2trt(model, example, **settings)
    except Exception as exc:  # torch2trt raises untyped errors
        raise StageError("build", f"torch2trt conversion failed: {' '.join(str(exc).split())[:300]}") from None
