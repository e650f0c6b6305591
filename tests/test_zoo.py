"""Model zoo: torchvision architectures, an LSTM and a transformer encoder through the real cpu build.

Every model goes through ``edgedeploy.build`` (reference, capture, export, preflight, build,
validate) with dynamic dims and must pass multi-shape parity with FP32 max abs error <= 1e-4.
Weights are random (``weights=None``), inputs tiny and widths reduced where torchvision allows,
so the zoo stays within a few minutes on two cores; the heavier members carry ``slow``.
"""

from __future__ import annotations

import textwrap
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import edgedeploy
from edgedeploy.config import config_from_dict

MAX_ABS = 1e-4
IMAGE_DIMS = {"batch": {"min": 1, "opt": 2, "max": 4}}
IMAGE_INPUT = [{"name": "image", "shape": ["batch", 3, 32, 32], "range": [-1.0, 1.0]}]

SEQUENCE_MODELS = '''
import torch
from torch import nn


class LstmTagger(nn.Module):
    """Two-layer LSTM over a dynamic-length sequence, a label per step."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out)


class TinyEncoder(nn.Module):
    """Token embedding, learned positions and a 2-layer transformer encoder; dynamic batch x sequence."""

    def __init__(self, vocab=50, width=16, max_len=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(1, max_len, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 3)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        return self.head(self.encoder(x))


class GruTagger(nn.Module):
    """Bidirectional GRU over a dynamic-length sequence."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 12, batch_first=True, bidirectional=True)
        self.head = nn.Linear(24, 3)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out)


class Recognizer(nn.Module):
    """OCR line recognizer: conv features, BiLSTM over the width, CTC log-probs per column."""

    def __init__(self, classes=11):
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d((2, 1)),
        )
        self.rnn = nn.LSTM(16 * 4, 16, bidirectional=True, batch_first=True)
        self.head = nn.Linear(32, classes)

    def forward(self, image):
        f = self.cnn(image)
        b, c, h, w = f.shape
        out, _ = self.rnn(f.permute(0, 3, 1, 2).reshape(b, w, c * h))
        return self.head(out).log_softmax(-1)


class Detector(nn.Module):
    """Anchor-free detection head without NMS: boxes and class scores per feature-map cell."""

    def __init__(self, classes=3):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.SiLU(),
            nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), nn.Conv2d(8, 16, 1), nn.SiLU(),
        )
        self.box = nn.Conv2d(16, 4, 1)
        self.cls = nn.Conv2d(16, classes, 1)

    def forward(self, image):
        f = self.backbone(image)
        boxes = self.box(f).flatten(2).transpose(1, 2).sigmoid()
        scores = self.cls(f).flatten(2).transpose(1, 2).sigmoid()
        return boxes, scores


def lstm():
    torch.manual_seed(0)
    return LstmTagger()


def gru():
    torch.manual_seed(0)
    return GruTagger()


def recognizer():
    torch.manual_seed(0)
    return Recognizer()


def detector():
    torch.manual_seed(0)
    return Detector()


def encoder():
    torch.manual_seed(0)
    return TinyEncoder()


def vit():
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10
    )
    # torchvision zero-initialises the head: every input would give the same logits, and parity would prove nothing
    nn.init.normal_(model.heads.head.weight, std=0.02)
    return model
'''


@dataclass(frozen=True)
class ZooModel:
    factory: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    inputs: list[dict[str, Any]] = field(default_factory=lambda: IMAGE_INPUT)
    dims: dict[str, dict[str, int]] = field(default_factory=lambda: IMAGE_DIMS)
    outputs: tuple[str, ...] = ("logits",)
    classifier: bool = True
    capture: str = "auto"  # the default: the zoo builds with default settings


def _tv(name: str, **kwargs: Any) -> ZooModel:
    return ZooModel(f"torchvision.models:{name}", {"num_classes": 10, **kwargs})


# The default run keeps one CNN (the demo's ResNet-18), the ViT, the LSTM and the detection head, all with default
# settings; the rest of the zoo (the OCR recognizer, the transformer encoder and the depthwise CNNs included) is
# `slow`, run by CI's separate slow step (.ci/run --slow).
ZOO: dict[str, Any] = {
    "resnet18": _tv("resnet18"),
    "mobilenet_v2": pytest.param(_tv("mobilenet_v2", width_mult=0.25), marks=pytest.mark.slow),
    "mobilenet_v3_small": pytest.param(_tv("mobilenet_v3_small", width_mult=0.5), marks=pytest.mark.slow),
    "mobilenet_v3_large": pytest.param(_tv("mobilenet_v3_large", width_mult=0.25), marks=pytest.mark.slow),
    "shufflenet_v2_x0_5": pytest.param(_tv("shufflenet_v2_x0_5"), marks=pytest.mark.slow),
    "squeezenet1_1": pytest.param(_tv("squeezenet1_1"), marks=pytest.mark.slow),
    "mnasnet0_5": pytest.param(_tv("mnasnet0_5"), marks=pytest.mark.slow),
    "regnet_x_400mf": pytest.param(_tv("regnet_x_400mf"), marks=pytest.mark.slow),
    "regnet_y_400mf": pytest.param(_tv("regnet_y_400mf"), marks=pytest.mark.slow),
    "efficientnet_b0": pytest.param(_tv("efficientnet_b0"), marks=pytest.mark.slow),
    "googlenet": pytest.param(_tv("googlenet", aux_logits=False, init_weights=False), marks=pytest.mark.slow),
    "vit_tiny": ZooModel("zoo_sequence:vit"),  # a torchvision ViT with a random (not zero) head
    "lraspp_mobilenet_v3_large": pytest.param(
        ZooModel(
            "torchvision.models.segmentation:lraspp_mobilenet_v3_large",
            {"weights": None, "weights_backbone": None, "num_classes": 3},
            inputs=[{"name": "image", "shape": [1, 3, "height", "width"], "range": [-1.0, 1.0]}],
            dims={"height": {"min": 32, "opt": 32, "max": 64}, "width": {"min": 32, "opt": 32, "max": 64}},
            outputs=("out",),
            classifier=False,
        ),
        marks=pytest.mark.slow,
    ),
    "lstm": ZooModel(
        "zoo_sequence:lstm",
        inputs=[{"name": "x", "shape": ["batch", "seq", 8], "range": [-1.0, 1.0]}],
        dims={"batch": {"min": 1, "opt": 2, "max": 3}, "seq": {"min": 1, "opt": 6, "max": 12}},
        outputs=("tags",),
        classifier=False,
    ),
    "gru": pytest.param(
        ZooModel(
            "zoo_sequence:gru",
            inputs=[{"name": "x", "shape": ["batch", "time", 8], "range": [-1.0, 1.0]}],
            dims={"batch": {"min": 1, "opt": 2, "max": 3}, "time": {"min": 1, "opt": 6, "max": 12}},
            outputs=("tags",),
            classifier=False,
        ),
        marks=pytest.mark.slow,
    ),
    "ocr_recognizer": pytest.param(
        ZooModel(
            "zoo_sequence:recognizer",
            inputs=[{"name": "image", "shape": ["batch", 1, 16, "width"], "range": [0.0, 1.0], "kind": "image"}],
            dims={"batch": {"min": 1, "opt": 2, "max": 3}, "width": {"min": 32, "opt": 64, "max": 160}},
            outputs=("logprobs",),
            classifier=False,
        ),
        marks=pytest.mark.slow,  # 40-80 s on 2 cores; the LSTM member keeps recurrent capture in the fast run
    ),
    "detector": ZooModel(
        "zoo_sequence:detector",
        inputs=[{"name": "image", "shape": ["batch", 3, "height", "width"], "range": [0.0, 1.0], "kind": "image"}],
        dims={
            "batch": {"min": 1, "opt": 2, "max": 3},
            "height": {"min": 32, "opt": 48, "max": 64},
            "width": {"min": 32, "opt": 64, "max": 96},
        },
        outputs=("boxes", "scores"),
        classifier=False,
    ),
    "transformer_encoder": pytest.param(
        ZooModel(
            "zoo_sequence:encoder",
            inputs=[{"name": "tokens", "shape": ["batch", "seq"], "dtype": "int64", "range": [0, 49]}],
            dims={"batch": {"min": 1, "opt": 2, "max": 3}, "seq": {"min": 2, "opt": 8, "max": 16}},
            outputs=("scores",),
            classifier=False,
        ),
        marks=pytest.mark.slow,  # the ViT and the transformer INT8 tests keep attention in the fast run
    ),
    "resnet50": pytest.param(_tv("resnet50"), marks=pytest.mark.slow),
    "resnext50_32x4d": pytest.param(_tv("resnext50_32x4d"), marks=pytest.mark.slow),
    "densenet121": pytest.param(_tv("densenet121"), marks=pytest.mark.slow),
    "convnext_tiny": pytest.param(_tv("convnext_tiny"), marks=pytest.mark.slow),
}


@pytest.fixture(autouse=True)
def one_torch_thread() -> Any:
    """One intra-op thread per test process: xdist already runs one process per core, and oversubscribed
    OpenMP threads spin instead of working."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _config(folder: Path, model: ZooModel) -> Any:
    folder.mkdir(parents=True, exist_ok=True)
    factory = model.factory
    if factory.startswith("zoo_sequence:"):  # our own modules: a unique module name per test process
        module = f"zoo_sequence_{uuid.uuid4().hex[:8]}"
        (folder / f"{module}.py").write_text(textwrap.dedent(SEQUENCE_MODELS))
        factory = factory.replace("zoo_sequence", module)
    raw = {
        "model": {"factory": factory, "kwargs": model.kwargs},
        "inputs": model.inputs,
        "dims": model.dims,
        "outputs": list(model.outputs),
        "export": {"capture": model.capture} if model.capture != "auto" else {},
        "tolerance": {"fp32": {"atol": MAX_ABS, "rtol": 0.0}},
        "validate": {
            "samples": 1,
            "latency_iters": 1,
            "latency_warmup": 0,
            "classifier_outputs": list(model.outputs) if model.classifier else [],
        },
        "build": {"target": "cpu", "out": str(folder / "out"), "cache": False},
    }
    return config_from_dict(raw, source=f"zoo:{factory}", base_dir=folder)


@pytest.mark.parametrize("model", list(ZOO.values()), ids=list(ZOO))
def test_zoo_model_builds_with_dynamic_shapes_and_fp32_parity(tmp_path: Path, model: ZooModel) -> None:
    import torch

    torch.manual_seed(0)
    result = edgedeploy.build(_config(tmp_path, model), log=lambda _line: None)
    assert result.ok
    export = result.report["metrics"]["export"]
    assert all(export["shape_probes"].values()) and len(export["shape_probes"]) >= 4
    onnx_checks = [
        c
        for cand in result.report["parity"]["candidates"]
        if cand["name"] == "onnxruntime-fp32"
        for c in cand["checks"]
        if c.get("check", "parity") == "parity"
    ]
    assert {c["shape"] for c in onnx_checks} >= {"min", "opt", "max"}
    worst = max(c["max_abs"] for c in onnx_checks)
    assert worst <= MAX_ABS, f"max abs error {worst:.3g} > {MAX_ABS}"
    _assert_declared_shapes_hold(result.out)


def _assert_declared_shapes_hold(out: Path) -> None:
    """Every static output dim the ONNX model declares equals the actual size at min / opt / max."""
    import numpy as np
    import onnx

    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    goldens = np.load(out / "goldens.npz")
    for o in model.graph.output:
        declared = [d.dim_value if d.HasField("dim_value") else None for d in o.type.tensor_type.shape.dim]
        for point in ("min", "opt", "max"):
            actual = goldens[f"{point}/0/out/{o.name}"].shape
            assert len(declared) == len(actual)
            for axis, (want, got) in enumerate(zip(declared, actual)):
                assert want is None or want == got, f"{o.name} dim {axis} declared {want}, is {got} at {point}"
