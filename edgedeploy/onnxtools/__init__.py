"""Tools over ONNX models (layer 1): export helpers, output naming and declared shapes (``outputs``),
the one ONNX Runtime session factory, shapes
and probe points, simplification, and op support per runtime version.

May import layer 0 (errors, config, artifacts, targets), ``fileio`` and ``modelio``; never
stages, pipeline or domain packages. onnx / onnxruntime / torch are imported inside functions.
"""
