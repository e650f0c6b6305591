"""FP16 / INT8 conversion that keeps accuracy: calibration data, ORT QDQ quantization, FP16 conversion,
activation-range and sensitivity analysis with automatic fallback, TensorRT calibration caches.

Every heavy dependency (onnxruntime, tensorrt, PIL) is imported inside functions.
"""
