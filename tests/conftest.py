"""Shared fixtures: a tiny real model project (module + safetensors checkpoint + deploy.toml)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

TINY_MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class TinyNet(nn.Module):
        def __init__(self, channels: int = 4, classes: int = 5):
            super().__init__()
            self.conv = nn.Conv2d(3, channels, 3, padding=1)
            self.bn = nn.BatchNorm2d(channels)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(channels, classes)

        def forward(self, image):
            x = torch.relu(self.bn(self.conv(image)))
            return self.fc(self.pool(x).flatten(1))


    def build(channels: int = 4, classes: int = 5):
        return TinyNet(channels, classes)
    """
)

# The tiny project pins the TorchScript exporter: the tests using it are about the pipeline, and a cold dynamo export
# costs seconds per build. The default route (exporter = "auto": TorchScript first after a clean trace capture on
# cpu, dynamo first on TensorRT targets) is built end to end by `use_default_exporter` below (test_pipeline), the
# exporter tests (test_export, test_capture, test_localize) and the model zoo.
TINY_TOML = textwrap.dedent(
    """
    outputs = ["logits"]

    [model]
    factory = "tinynet:build"
    kwargs = { channels = 4, classes = 5 }
    checkpoint = "tiny.safetensors"

    [[inputs]]
    name = "image"
    shape = ["batch", 3, 16, 16]
    range = [-1.0, 1.0]

    [dims.batch]
    min = 1
    opt = 2
    max = 4

    [validate]
    samples = 1
    latency_iters = 2
    latency_warmup = 1
    classifier_outputs = ["logits"]

    [export]
    exporter = "torchscript"

    [build]
    out = "out"
    """
)


@pytest.fixture(autouse=True, scope="module")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Each test module gets its own stage cache and cache key (never the user's ~/.cache or ~/.config).

    Module scope, so a module's build fixtures and its tests share one cache, as they share one project.
    """
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(home / "cache"))
        mp.setenv("XDG_CONFIG_HOME", str(home / "config"))
        mp.setenv("EDGEDEPLOY_CACHE_DIR", str(home / "cache" / "edgedeploy"))
        mp.delenv("EDGEDEPLOY_CACHE_KEY", raising=False)
        yield home / "cache" / "edgedeploy"


@pytest.fixture
def test_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stage cache of this test's own (mode 700), for tests that count which stages a later build replays."""
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(folder))
    return folder


def write_matmul_onnx(path: Path, weight: float = 1.0, *, external: bool = False) -> None:
    """A given ONNX model ``y = x @ W`` (``x``: ``batch`` x 8, W all ``weight``); ``external``: W in
    ``<name>.data`` beside it, so the same graph file can hold any W."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((8, 4), weight, np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if external:
        onnx.save(model, str(path), save_as_external_data=True, location=f"{path.name}.data", size_threshold=0)
    else:
        onnx.save(model, str(path))


def use_default_exporter(cfg: Path) -> Path:
    """Drop the tiny project's exporter pin from ``cfg``: the build takes the default route (auto)."""
    text = cfg.read_text()
    pin = '[export]\nexporter = "torchscript"\n\n'
    assert pin in text, "the tiny project's exporter pin moved: update use_default_exporter"
    cfg.write_text(text.replace(pin, ""))
    return cfg


def write_tiny_project(folder: Path, *, seed: int = 0, toml: str = TINY_TOML) -> Path:
    """Write tinynet.py, tiny.safetensors and deploy.toml into ``folder``; return the config path."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tinynet.py").write_text(TINY_MODEL)
    torch.manual_seed(seed)
    ns: dict = {}
    exec(compile(TINY_MODEL, "tinynet.py", "exec"), ns)  # the fixture's own source, not user input
    model = ns["build"]()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "tiny.safetensors"))
    cfg = folder / "deploy.toml"
    cfg.write_text(toml)
    return cfg


def write_unique_tiny_project(folder: Path) -> Path:
    """:func:`write_tiny_project` with a module name of its own (one process imports each project's model afresh);
    returns the config path."""
    import uuid

    name = f"tinynet_{uuid.uuid4().hex[:8]}"
    cfg = write_tiny_project(folder, toml=TINY_TOML.replace("tinynet:build", f"{name}:build"))
    (folder / "tinynet.py").rename(folder / f"{name}.py")
    return cfg


@pytest.fixture
def tiny_project(tmp_path: Path) -> Path:
    """Path of a deploy.toml for a tiny CNN with a real safetensors checkpoint (module name unique per test)."""
    return write_unique_tiny_project(tmp_path / "proj")
