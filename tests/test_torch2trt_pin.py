"""The Jetson image's torch2trt pin is a commit that runs on the image's TensorRT (10.3)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# torch2trt commits read against NVIDIA-AI-IOT/torch2trt: torch2trt/torch2trt.py guards
# `config.max_workspace_size` with `trt_version() < "10.0"` and builds with `build_serialized_network` on 10.
# 450cb2ef (2020-07) calls builder.max_workspace_size / fp16_mode / build_cuda_engine: gone in 8.x and 10.x.
TENSORRT_10_READY = {"4e820ae31b4e35d59685935223b05b2e11d47b03": "master 2024-05-03, dev_trt_10_refactor merged"}


def test_jetson_image_pins_a_torch2trt_that_knows_tensorrt_10():
    text = (ROOT / "docker" / "jetson.Dockerfile").read_text()
    refs = re.findall(r"^ARG TORCH2TRT_REF=(\S+)$", text, flags=re.M)
    assert len(refs) == 1 and refs[0] in TENSORRT_10_READY, refs
