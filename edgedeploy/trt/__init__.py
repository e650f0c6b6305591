"""TensorRT: build plans, trtexec command lines, engine provenance and the one TensorRT adapter."""
