"""User code is an input of the build: every file the model imports is hashed, and each project's
code is loaded under its own name (two ``tinynet.py`` in one process stay two models)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_TOML, write_tiny_project

import edgedeploy
from edgedeploy.pipeline.runner import BuildResult

HELPED_MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn

    from tiny_helper import act


    class TinyNet(nn.Module):
        def __init__(self, channels: int = 4, classes: int = 5):
            super().__init__()
            self.conv = nn.Conv2d(3, channels, 3, padding=1)
            self.bn = nn.BatchNorm2d(channels)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(channels, classes)

        def forward(self, image):
            x = act(self.bn(self.conv(image)))
            return self.fc(self.pool(x).flatten(1))


    def build(channels: int = 4, classes: int = 5):
        return TinyNet(channels, classes)
    """
)
RELU = "import torch\n\n\ndef act(x):\n    return torch.relu(x)\n"
TANH = "import torch\n\n\ndef act(x):\n    return 5 * torch.tanh(x)\n"


def _ops(path: Path) -> set[str]:
    import onnx

    return {n.op_type for n in onnx.load(str(path)).graph.node}


def _status(result: BuildResult) -> dict[str, str]:
    return {s.name: s.status for s in result.stages}


def test_changed_helper_module_rebuilds_the_model(tmp_path: Path) -> None:
    cfg = write_tiny_project(tmp_path / "proj")
    (tmp_path / "proj" / "tinynet.py").write_text(HELPED_MODEL)
    helper = tmp_path / "proj" / "tiny_helper.py"
    helper.write_text(RELU)
    first = edgedeploy.build(cfg, log=lambda _: None)
    assert "Relu" in _ops(first.out / "model.onnx") and "Tanh" not in _ops(first.out / "model.onnx")

    helper.write_text(TANH)
    second = edgedeploy.build(cfg, log=lambda _: None)
    status = _status(second)
    assert status["reference"] == status["capture"] == status["export"] == "ran", status
    assert "Tanh" in _ops(second.out / "model.onnx")
    assert second.ok
    manifest = json.loads((second.out / "manifest.json").read_text())
    assert str(helper.resolve()) in {f["path"] for f in manifest["inputs"]["model_code"]["files"]}


def test_two_projects_with_the_same_module_name_build_their_own_models(tmp_path: Path) -> None:
    a = write_tiny_project(tmp_path / "a")
    b = write_tiny_project(tmp_path / "b", toml=TINY_TOML.replace("classes = 5", "classes = 7"))
    model_b = (tmp_path / "b" / "tinynet.py").read_text().replace("torch.relu(", "torch.tanh(")
    (tmp_path / "b" / "tinynet.py").write_text(model_b)
    (tmp_path / "b" / "tiny.safetensors").unlink()
    b.write_text(b.read_text().replace('checkpoint = "tiny.safetensors"\n', ""))

    built_a = edgedeploy.build(a, log=lambda _: None)
    built_b = edgedeploy.build(b, log=lambda _: None)

    import onnxruntime as ort

    x = np.zeros((1, 3, 16, 16), np.float32)
    for built, classes, op in ((built_a, 5, "Relu"), (built_b, 7, "Tanh")):
        sess = ort.InferenceSession(str(built.out / "model.onnx"), providers=["CPUExecutionProvider"])
        assert sess.run(None, {"image": x})[0].shape == (1, classes)
        assert op in _ops(built.out / "model.onnx")
    manifest_b = json.loads((built_b.out / "manifest.json").read_text())
    assert manifest_b["inputs"]["model_code"]["path"] == str((tmp_path / "b" / "tinynet.py").resolve())


def test_validation_data_changed_in_place_reruns_reference_and_validate(tmp_path: Path) -> None:
    toml = TINY_TOML.replace("[validate]\n", '[validate]\ndata = "val.npz"\n')
    cfg = write_tiny_project(tmp_path / "proj", toml=toml)
    data = tmp_path / "proj" / "val.npz"
    rng = np.random.default_rng(0)
    np.savez(data, image=rng.uniform(-1, 1, (2, 3, 16, 16)).astype(np.float32))
    first = edgedeploy.build(cfg, log=lambda _: None)
    goldens_first = (first.out / "goldens.npz").read_bytes()

    np.savez(data, image=rng.uniform(-1, 1, (2, 3, 16, 16)).astype(np.float32))
    second = edgedeploy.build(cfg, log=lambda _: None)
    status = _status(second)
    assert status["reference"] == "ran" and status["validate"] == "ran", status
    assert status["export"] == "cached"
    assert (second.out / "goldens.npz").read_bytes() != goldens_first


def test_a_factory_that_fails_to_import_writes_nothing(tmp_path: Path) -> None:
    from edgedeploy.errors import ConfigError

    cfg = write_tiny_project(tmp_path / "proj")
    (tmp_path / "proj" / "tinynet.py").write_text("raise RuntimeError('broken on import')\n")
    with pytest.raises(ConfigError, match="broken on import"):
        edgedeploy.build(cfg, log=lambda _: None)
    out = tmp_path / "proj" / "out"
    assert not list(out.glob(".staging-*")) and not (out / "model.onnx").exists()


def test_a_helper_edited_in_the_same_second_is_read_from_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timestamp .pyc matches a same-size edit made within the same second: user code never uses one."""
    import os
    import sys

    from edgedeploy.modelio.usercode import forget, load_module

    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # CI writes .pyc files (.ci/run)
    root = tmp_path / "proj"
    root.mkdir()
    helper = root / "scalehelper.py"
    helper.write_text("SCALE = 1.0\n")
    (root / "calibsource.py").write_text("from scalehelper import SCALE\n\nVALUE = SCALE\n")
    try:
        assert load_module("calibsource", [root]).module.VALUE == 1.0
        before = helper.stat()
        helper.write_text("SCALE = 0.5\n")  # same size, and the same modification time below
        os.utime(helper, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert load_module("calibsource", [root]).module.VALUE == 0.5
        assert not (root / "__pycache__").exists()  # a build writes nothing into the project
    finally:
        forget()


def test_a_package_submodule_edited_in_the_same_second_is_read_from_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submodules of the project's own packages get the source-only loader too (those of other packages are
    left to the regular finders without a second search)."""
    import os
    import sys

    from edgedeploy.modelio.usercode import forget, load_module

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    root = tmp_path / "proj"
    (root / "helpers").mkdir(parents=True)
    (root / "helpers" / "__init__.py").write_text("")
    helper = root / "helpers" / "scale.py"
    helper.write_text("SCALE = 1.0\n")
    (root / "pkgsource.py").write_text("import json.decoder\nfrom helpers.scale import SCALE\n\nVALUE = SCALE\n")
    try:
        assert load_module("pkgsource", [root]).module.VALUE == 1.0
        before = helper.stat()
        helper.write_text("SCALE = 0.5\n")
        os.utime(helper, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert load_module("pkgsource", [root]).module.VALUE == 0.5
        assert not (root / "helpers" / "__pycache__").exists()
    finally:
        forget()
