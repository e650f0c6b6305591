"""FP16 / INT8 conversion that keeps accuracy: calibration data, ORT QDQ quantization, FP16 conversion,
activation-range and sensitivity analysis with automatic fallback, TensorRT calibration caches.

Domain layer (2): may import plain data (errors, config, artifacts, runtimes), the tools (``fileio``,
``modelio``, ``onnxtools``) and ``validate`` (parity metrics, latency); never ``stages`` or ``pipeline``.
Every heavy dependency (onnxruntime, tensorrt, PIL) is imported inside functions.
"""
