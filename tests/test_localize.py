"""Divergence localization on a small residual CNN: a perturbed layer is found and named."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

# one xdist worker runs this module, so its module-scoped build fixture runs once (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_localize")

RESNETISH = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(c)
            self.relu = nn.ReLU()

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(y)) + x)   # shared ReLU: second call is 'relu_1'


    class Net(nn.Module):
        def __init__(self, c=6, classes=4):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
            self.layers = nn.Sequential(Block(c), Block(c), Block(c))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(c, classes)

        def forward(self, image):
            return self.fc(self.pool(self.layers(self.stem(image))).flatten(1))


    def build():
        torch.manual_seed(0)
        net = Net()
        for m in net.modules():   # non-trivial BatchNorm statistics, so folding matters
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.data.uniform_(0.5, 1.5)
        return net
    """
)

TOML = textwrap.dedent(
    """
    outputs = ["logits"]

    [model]
    factory = "{module}:build"

    [[inputs]]
    name = "image"
    shape = ["batch", 3, 12, 12]
    range = [-1.0, 1.0]

    [dims.batch]
    min = 1
    opt = 2
    max = 3

    [validate]
    samples = 1
    latency_iters = 2
    latency_warmup = 1
    classifier_outputs = ["logits"]

    [build]
    out = "out"
    """
)


def write_project(folder: Path, module: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(RESNETISH)
    cfg = folder / "deploy.toml"
    cfg.write_text(TOML.format(module=module))
    return cfg


CONVS = ["stem.0", "layers.0.conv1", "layers.0.conv2", "layers.1.conv1", "layers.1.conv2", "layers.2.conv1"]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory):
    """exporter -> a finished cpu build of the residual CNN, built once per module (a parametrized module
    fixture is torn down and rebuilt whenever pytest interleaves its parameters)."""
    import uuid

    from edgedeploy.config import load_config
    from edgedeploy.pipeline.runner import run_build

    done: dict[str, tuple[object, Path]] = {}

    def get(exporter: str) -> tuple[object, Path]:
        if exporter not in done:
            folder = tmp_path_factory.mktemp(f"resnetish-{exporter}")
            path = write_project(folder, f"resnetish_{uuid.uuid4().hex[:8]}")
            cfg = load_config(path, {"export.exporter": exporter})
            result = run_build(cfg, log=lambda _: None)
            assert result.ok
            assert result.report["metrics"]["export"]["exporter"] == exporter
            done[exporter] = (cfg, result.out)
        return done[exporter]

    return get


@pytest.fixture(params=["torchscript", "dynamo"])
def built(request: pytest.FixtureRequest, builds) -> tuple[object, Path]:
    """A finished cpu build of the residual CNN with each ONNX exporter: (config, output folder)."""
    return builds(request.param)


def _model(cfg: object) -> object:
    from edgedeploy.modelio.checkpoint import load_model

    return load_model(cfg, None)


def _feeds(out: Path) -> dict[str, np.ndarray]:
    from edgedeploy.modelio.goldens import load_goldens

    return load_goldens(out / "goldens.npz")["opt"][0]["in"]


def _conv_node(src: Path, module: str) -> str:
    """Name of the Conv node made from ``module`` (Convs appear in execution order in both exporters)."""
    import onnx

    convs = [n.name for n in onnx.load(str(src)).graph.node if n.op_type == "Conv"]
    return convs[CONVS.index(module)]


def _edit_initializer(src: Path, dst: Path, module: str, edit: object) -> str:
    """Copy the ONNX model with ``edit(array)`` applied to the weight of ``module``'s Conv; return the node name."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    name = _conv_node(src, module)
    node = next(n for n in model.graph.node if n.name == name)
    init = next(i for i in model.graph.initializer if i.name == node.input[1])
    arr = numpy_helper.to_array(init).copy()
    edit(arr)
    init.CopyFrom(numpy_helper.from_array(arr, init.name))
    onnx.save(model, str(dst))
    return name


def test_boundaries_map_exporter_scopes_to_modules(built: tuple[object, Path]) -> None:
    import onnx

    from edgedeploy.validate.localize import find_boundaries, record_calls

    cfg, out = built
    model = _model(cfg)
    records = record_calls(model, cfg, _feeds(out))
    graph = onnx.load(str(out / "model.onnx")).graph
    bounds = find_boundaries(graph, records, {n for n, _ in model.named_modules()})
    by_module = {(b.module, b.record.local): b for b in bounds}
    for module in CONVS:
        conv = by_module[(module, 0)]
        assert conv.node == _conv_node(out / "model.onnx", module)
    bn = CONVS[4].replace("conv", "bn")
    assert bn in by_module[(CONVS[4], 0)].fused  # BatchNorm folded into the Conv
    second_relu = by_module[("layers.2.relu", 1)]  # the shared ReLU's second call
    assert second_relu.op == "Relu"
    assert second_relu.position > by_module[("layers.2.conv2", 0)].position
    if cfg.export.exporter == "torchscript":
        assert by_module[("layers.1.conv2", 0)].node == "/layers/layers.1/conv2/Conv"
        assert second_relu.node == "/layers/layers.2/relu_1/Relu"
    positions = [b.position for b in bounds]
    assert positions == sorted(positions)


def test_unchanged_model_is_not_localized(built: tuple[object, Path]) -> None:
    from edgedeploy.validate.localize import localize

    cfg, out = built
    result = localize(out / "model.onnx", _model(cfg), cfg, _feeds(out), precision="fp32")
    assert result["status"] == "not localized"
    assert result["boundaries"] >= 10


@pytest.mark.parametrize("module", ["layers.1.conv1", "layers.2.conv1", "stem.0"])
def test_perturbed_conv_weight_is_localized_to_its_module(
    built: tuple[object, Path], tmp_path: Path, module: str
) -> None:
    from edgedeploy.validate.localize import describe, localize

    cfg, out = built
    bad = tmp_path / "bad.onnx"

    def scale_first_filter(w: np.ndarray) -> None:
        w[0] *= 1.5

    node = _edit_initializer(out / "model.onnx", bad, module, scale_first_filter)
    result = localize(bad, _model(cfg), cfg, _feeds(out), precision="fp32")
    assert result["status"] == "localized", result
    assert result["module"] == module
    assert result["onnx_node"] == node
    assert result["error"]["rel_l2"] > result["threshold_rel_l2"]
    if "previous" in result:  # the boundary before it still agreed
        assert result["previous"]["error"]["rel_l2"] < result["threshold_rel_l2"]
    assert f"'{module}'" in describe(result)
    assert result["probes"] <= 1 + int(np.ceil(np.log2(result["boundaries"])))


def _stage_context(cfg: object, out: Path, staging: Path) -> object:
    from edgedeploy.stages.base import BuildContext
    from edgedeploy.targets import get_target

    shutil.copytree(out, staging)
    return BuildContext(cfg=cfg, target=get_target("cpu"), staging=staging, out=out, log=None)


def test_stage_names_the_perturbed_layer_in_its_parity_error(built: tuple[object, Path], tmp_path: Path) -> None:
    from edgedeploy.errors import ParityError
    from edgedeploy.stages.validate import ParityFromGoldens

    cfg, out = built
    ctx = _stage_context(cfg, out, tmp_path / "staging")

    def perturb(w: np.ndarray) -> None:
        w[:, :1] += 0.5

    node = _edit_initializer(out / "model.onnx", ctx.staging / "model.onnx", "layers.0.conv2", perturb)
    with pytest.raises(ParityError) as err:
        ParityFromGoldens().run(ctx)
    msg = err.value.one_line()
    assert "onnxruntime-fp32" in msg
    assert f"{node} -> PyTorch module 'layers.0.conv2'" in msg
    cands = {c["name"]: c for c in err.value.partial.metrics["parity"]["candidates"]}
    assert cands["torchscript"]["status"] == "passed"  # only the edited artifact fails
    loc = cands["onnxruntime-fp32"]["localization"]
    assert loc["module"] == "layers.0.conv2" and loc["sample"]["output"] == "logits"


def test_nan_candidate_fails_with_its_own_message(built: tuple[object, Path], tmp_path: Path) -> None:
    from edgedeploy.errors import ParityError
    from edgedeploy.stages.validate import ParityFromGoldens
    from edgedeploy.validate.parity import NON_FINITE

    cfg, out = built
    ctx = _stage_context(cfg, out, tmp_path / "staging")

    def poison(w: np.ndarray) -> None:
        w[2, 0, 0, 0] = np.nan

    _edit_initializer(out / "model.onnx", ctx.staging / "model.onnx", "layers.1.conv1", poison)
    with pytest.raises(ParityError) as err:
        ParityFromGoldens().run(ctx)
    assert f"{NON_FINITE}:" in err.value.message
    cand = next(c for c in err.value.partial.metrics["parity"]["candidates"] if c["name"] == "onnxruntime-fp32")
    failing = [c for c in cand["checks"] if not c["passed"]]
    assert failing and all(NON_FINITE in c["failure"] for c in failing)
    assert all(c["nan"] > 0 for c in failing if c["check"] == "parity")
    assert cand["localization"]["module"] == "layers.1.conv1"
    assert cand["localization"]["error"]["non_finite"] > 0


def test_int8_qdq_candidate_is_localized_through_its_dequantized_weights(
    built: tuple[object, Path], tmp_path: Path
) -> None:
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from edgedeploy.validate.localize import localize

    cfg, out = built
    feeds = _feeds(out)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(1)
            self.batches = iter([{"image": rng.uniform(-1, 1, (2, 3, 12, 12)).astype(np.float32)} for _ in range(8)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    qdq = tmp_path / "model.int8.onnx"
    quantize_static(
        str(out / "model.onnx"), str(qdq), Reader(), quant_format=QuantFormat.QDQ, weight_type=QuantType.QInt8
    )
    assert localize(qdq, _model(cfg), cfg, feeds, precision="int8")["status"] == "not localized"

    model = onnx.load(str(qdq))
    conv = [n for n in model.graph.node if n.op_type == "Conv"][CONVS.index("layers.1.conv2")]
    dq = next(n for n in model.graph.node if conv.input[1] in n.output)  # weight -> DequantizeLinear -> Conv
    scale = next(i for i in model.graph.initializer if i.name == dq.input[1])
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(4.0), scale.name))
    onnx.save(model, str(tmp_path / "bad.onnx"))
    result = localize(tmp_path / "bad.onnx", _model(cfg), cfg, feeds, precision="int8")
    assert result["status"] == "localized" and result["module"] == "layers.1.conv2"
    assert result["onnx_node"] == conv.name
