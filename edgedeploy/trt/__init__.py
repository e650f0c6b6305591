"""TensorRT: build plans, trtexec command lines, engine provenance and the one TensorRT adapter.

Domain layer (2): may import plain data, the tools and ``device`` (shared bundle constants); never
``stages`` or ``pipeline``. ``adapter`` is the only module that touches the tensorrt API.
"""
