"""The one ONNX Runtime session factory (CPU provider), so every caller gets the same options and errors."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgedeploy.errors import StageError

if TYPE_CHECKING:
    from edgedeploy.hostenv import HostEnvironment, Readiness
    from edgedeploy.targets import TargetProfile


# ONNX Runtime's session key that turns its Q/DQ fusions off (onnxruntime_session_options_config_keys.h); with it
# off, constant folding also dequantizes constant weights once instead of on every run
DISABLE_QDQ_FUSION = "session.disable_quant_qdq"


def ort_session(
    path: str | Path,
    *,
    threads: int | None = None,
    optimize: bool = True,
    stage: str = "build",
    qdq_as_written: bool = False,
) -> Any:
    """A CPU ONNX Runtime session for ``path``.

    Args:
        threads: intra-op threads (default: ONNX Runtime's choice).
        optimize: all graph optimizations on; ``False`` keeps every tensor name (for analysis).
        stage: the stage named in the error.
        qdq_as_written: run a Q/DQ graph as its operators define it (float arithmetic between each
            DequantizeLinear and QuantizeLinear, constant weights dequantized once), not fused into ONNX
            Runtime's own INT8 kernels: the stand-in for a runtime whose INT8 kernels are not ONNX Runtime's
            (TensorRT). Its Q/DQ placement (no pair between a conv and its activation) leaves most convs outside
            ONNX Runtime's fusions, where they would dequantize their weights on every run: 2-3x slower.

    Raises:
        StageError: ONNX Runtime refuses the model.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    opts.log_severity_level = 3
    if qdq_as_written:
        opts.add_session_config_entry(DISABLE_QDQ_FUSION, "1")
    if threads:
        opts.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped exceptions
        raise StageError(stage, f"ONNX Runtime cannot load {path}: {' '.join(str(exc).split())[:300]}") from None


def onnxruntime_version() -> str | None:
    """Installed ONNX Runtime version, or None when it does not import (the runtime's environment probe)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    return str(ort.__version__)


def onnxruntime_readiness(env: HostEnvironment, target: TargetProfile) -> Readiness:
    """ONNX Runtime's verdict for ``deploy doctor``: its artifact needs only ONNX Runtime with the CPU provider."""
    from edgedeploy.hostenv import Readiness

    reasons: list[str] = []
    if not env.onnxruntime_version:
        reasons.append("onnxruntime not installed")
    elif "CPUExecutionProvider" not in env.ort_providers:
        reasons.append("onnxruntime has no CPUExecutionProvider")
    what = "ONNX Runtime artifact built and validated here" if not reasons else "cannot build here"
    return Readiness(what, tuple(reasons))
