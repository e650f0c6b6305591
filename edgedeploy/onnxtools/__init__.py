"""ONNX helpers behind the capture, export and preflight stages: shape probes, simplification, op support."""
