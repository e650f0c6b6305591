"""One registry of artifact file names: what each stage writes, and the companions that travel with it.

Plain data (layer 0): stages, the TensorRT plan and bundle, and the validation runners name files
through these constants instead of spelling them out, so a renamed artifact changes in one place.
"""

from __future__ import annotations

CHECKPOINT = "checkpoint"  # external input: the weights file (not in staging)
CALIBRATION = "calibration"  # external input: the calibration set
VALIDATION_DATA = "validation_data"  # external input: validate.data
MODEL_CODE = "model_code"  # external input: the user's model source files
CALIB_CODE = "calib_code"  # external input: the source files of precision.calib_callable and what it imports

GOLDENS = "goldens.npz"
TORCHSCRIPT = "model.ts"
EXPORTED_PROGRAM = "model.pt2"
ONNX_MODEL = "model.onnx"
ONNX_DATA = "model.onnx.data"
PREFLIGHT = "preflight.json"
FP16_MODEL = "model.fp16.onnx"
# the FP32 graph rounding what FP16 stores (the precision stage's host check): the bundle's FP16 dry run
FP16_SIMULATED = "model.fp16-simulated.onnx"
INT8_MODEL = "model.int8.onnx"
PRECISION_JSON = "precision.json"
RUNTIME_INFO = "runtime.json"
PLAN = "plan.json"
ENGINE = "model.engine"
TIMING_CACHE = "timing.cache"
CALIB_CACHE = "calib.cache"
BUNDLE_DIR = "bundle"
BUNDLE_MANIFEST = "bundle.json"
BUNDLE_README = "README.txt"
REPORT = "report.json"
MANIFEST = "manifest.json"

# ONNX model per precision: what the precision stage writes and the build stage turns into the artifact
PRECISION_MODELS = {"fp32": ONNX_MODEL, "fp16": FP16_MODEL, "int8": INT8_MODEL}
# files that must travel with an artifact (ONNX external data beside a >2 GiB model)
COMPANIONS = {ONNX_MODEL: (ONNX_DATA,)}


def deploy_model_name(precision: str) -> str:
    """The ONNX file the build stage turns into the artifact for ``precision``."""
    return PRECISION_MODELS[precision]


def with_companions(name: str) -> tuple[str, ...]:
    """``name`` and the files that travel with it (``model.onnx`` → also ``model.onnx.data``)."""
    return (name, *COMPANIONS.get(name, ()))
