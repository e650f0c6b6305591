"""Every user file a build depends on is hashed and listed: the calibration callable's imports too, and
modules the user's own process imported before calling ``edgedeploy.build()``."""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TINY_TOML, write_tiny_project
from test_user_code import HELPED_MODEL as USER_CODE_MODEL
from test_user_code import RELU, TANH

import edgedeploy
from edgedeploy.pipeline.runner import BuildResult

CALIB_MODULE = textwrap.dedent(
    """
    from {helper} import load_batches

    with open(__file__ + ".imports", "a") as log:  # how often a build executes this module
        log.write("x")


    def batches():
        yield from load_batches()
    """
)
CALIB_HELPER = textwrap.dedent(
    """
    import numpy as np

    SCALE = {scale}


    def load_batches():
        rng = np.random.default_rng(0)
        for _ in range(3):
            yield {{"image": (SCALE * rng.uniform(-1, 1, (2, 3, 16, 16))).astype("float32")}}
    """
)
# test_user_code's model, importing ``act`` from a helper module named per test
HELPED_MODEL = USER_CODE_MODEL.replace("from tiny_helper import act", "from {helper} import act")


def _quiet(_: str) -> None:
    pass


def _status(result: BuildResult) -> dict[str, str]:
    return {s.name: s.status for s in result.stages}


def _ops(path: Path) -> set[str]:
    import onnx

    return {n.op_type for n in onnx.load(str(path)).graph.node}


def _code_files(out: Path, name: str) -> set[str]:
    manifest = json.loads((out / "manifest.json").read_text())
    return {f["path"] for f in manifest["inputs"].get(name, {}).get("files", [])}


def _unique(stem: str) -> str:
    return f"{stem}_{uuid.uuid4().hex[:8]}"  # sys.modules is shared by every test in this process


# ---- the calibration callable's imports ------------------------------------------------------


def _int8_project(folder: Path) -> tuple[Path, Path, Path]:
    calib, helper = _unique("tiny_calib"), _unique("calib_helpers")
    toml = TINY_TOML + f'\n[precision]\nmode = "int8"\ncalib_callable = "{calib}:batches"\n'
    cfg = write_tiny_project(folder, toml=toml)
    (folder / f"{calib}.py").write_text(CALIB_MODULE.format(helper=helper))
    (folder / f"{helper}.py").write_text(CALIB_HELPER.format(scale="1.0"))
    return cfg, folder / f"{calib}.py", folder / f"{helper}.py"


def test_calibration_helper_edit_reruns_precision_and_lists_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from edgedeploy.cli import main

    cfg, calib, helper = _int8_project(tmp_path / "proj")
    assert main(["build", "--config", str(cfg)]) == 0
    # deploy build says which of the user's files key the cache; the manifest lists them with their hashes
    err = capsys.readouterr().err
    assert "  model_code: tinynet.py\n" in err and f"  calib_code: {calib.name}, {helper.name}\n" in err, err
    out = cfg.parent / "out"
    data_first = json.loads((out / "precision.json").read_text())["calibration"]["data_sha256"]
    listed = _code_files(out, "calib_code")
    assert {str(calib.resolve()), str(helper.resolve())} <= listed, listed

    imports = Path(f"{calib}.imports")
    assert imports.read_text() == "x"  # loaded once per build: hashed, then used by reference and precision

    again = edgedeploy.build(cfg, log=_quiet)  # nothing edited: nothing runs again
    assert _status(again)["precision"] == "cached", _status(again)
    assert imports.read_text() == "xx"

    helper.write_text(CALIB_HELPER.format(scale="0.5"))  # the callable's own file is unchanged
    second = edgedeploy.build(cfg, log=_quiet)
    # the precision stage calibrates on the new batches; the goldens hold the new held-out batches
    assert _status(second)["precision"] == _status(second)["reference"] == "ran", _status(second)
    assert _status(second)["export"] == "cached"
    data_second = json.loads((second.out / "precision.json").read_text())["calibration"]["data_sha256"]
    assert data_second != data_first


def test_a_calibration_callable_that_does_not_import_fails_before_anything_is_written(tmp_path: Path) -> None:
    from edgedeploy.errors import ConfigError

    cfg, calib, _ = _int8_project(tmp_path / "proj")
    calib.write_text("raise RuntimeError('no camera on import')\n")
    with pytest.raises(ConfigError, match="precision.calib_callable.*no camera on import"):
        edgedeploy.build(cfg, log=_quiet)
    out = tmp_path / "proj" / "out"
    assert not list(out.glob(".staging-*")) and not (out / "model.onnx").exists()


# ---- modules the user's process imported before the build ----------------------------------


@pytest.fixture
def user_imported(tmp_path: Path) -> Iterator[tuple[Path, Path, str]]:
    """A project whose model imports a helper, both imported by the test itself (as a notebook would)."""
    model, helper = _unique("tinynet"), _unique("tiny_helper")
    folder = tmp_path / "proj"
    cfg = write_tiny_project(folder, toml=TINY_TOML.replace("tinynet:build", f"{model}:build"))
    (folder / "tinynet.py").unlink()
    (folder / f"{model}.py").write_text(HELPED_MODEL.format(helper=helper))
    (folder / f"{helper}.py").write_text(RELU)
    sys.path.insert(0, str(folder))
    try:
        __import__(model)  # the user's session now owns both modules
        assert helper in sys.modules
        yield cfg, folder / f"{helper}.py", helper
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(model, None)
        sys.modules.pop(helper, None)


def test_a_helper_the_user_imported_is_listed_and_read_afresh(user_imported: tuple[Path, Path, str]) -> None:
    cfg, helper, name = user_imported
    users_module = sys.modules[name]
    first = edgedeploy.build(cfg, log=_quiet)
    assert "Relu" in _ops(first.out / "model.onnx")
    assert str(helper.resolve()) in _code_files(first.out, "model_code")  # hashed although already imported

    helper.write_text(TANH)
    second = edgedeploy.build(cfg, log=_quiet)
    assert _status(second)["export"] == "ran", _status(second)
    assert "Tanh" in _ops(second.out / "model.onnx") and "Relu" not in _ops(second.out / "model.onnx")
    # the user's session keeps the module object it imported (the build never replaces it)
    assert sys.modules[name] is users_module


@pytest.fixture
def outside_helper(tmp_path: Path) -> Iterator[tuple[Path, Path, Path, str]]:
    """A model whose helper lives outside model.python_path (the user's own sys.path entry), and a constant
    module the helper imports; the test's process imported both before the build."""
    helper, consts = _unique("ext_helper"), _unique("ext_consts")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / f"{consts}.py").write_text("GAIN = 1.0\n")
    (lib / f"{helper}.py").write_text(
        f"import torch\n\nfrom {consts} import GAIN\n\n\ndef act(x):\n    return GAIN * torch.relu(x)\n"
    )
    model = _unique("tinynet")
    folder = tmp_path / "proj"
    cfg = write_tiny_project(folder, toml=TINY_TOML.replace("tinynet:build", f"{model}:build"))
    (folder / "tinynet.py").unlink()
    (folder / f"{model}.py").write_text(HELPED_MODEL.format(helper=helper))
    sys.path.insert(0, str(lib))
    try:
        __import__(helper)
        yield cfg, lib / f"{helper}.py", lib / f"{consts}.py", consts
    finally:
        sys.path.remove(str(lib))
        sys.modules.pop(helper, None)
        sys.modules.pop(consts, None)


def test_imported_helpers_outside_the_project_are_listed_and_refused_when_edited_since(
    outside_helper: tuple[Path, Path, Path, str],
) -> None:
    import importlib

    from edgedeploy.errors import ConfigError

    cfg, helper, consts, name = outside_helper
    built = edgedeploy.build(cfg, log=_quiet)
    # the helper is reached through the model's globals, its constant module through its import statement
    assert {str(helper.resolve()), str(consts.resolve())} <= _code_files(built.out, "model_code")
    consts.write_text("GAIN = 2.0\n")  # the process still runs GAIN = 1.0
    with pytest.raises(ConfigError, match=f"changed on disk since this process imported module '{name}'"):
        edgedeploy.build(cfg, log=_quiet)
    out = cfg.parent / "out"
    assert _code_files(out, "model_code")  # the refused build left the previous output as it was
    importlib.reload(sys.modules[name])  # the user's fix: the module, then the one importing from it
    importlib.reload(sys.modules[helper.stem])
    assert edgedeploy.build(cfg, log=_quiet).ok


def test_dependencies_follow_relative_and_function_level_imports(tmp_path: Path) -> None:
    from edgedeploy.modelio.userfiles import user_dependencies

    pkg = _unique("userpkg")
    root = tmp_path / pkg
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "consts.py").write_text("SCALE = 2\n")
    (root / "lazy.py").write_text("X = 1\n")
    (root / "unused.py").write_text("Y = 1\n")
    (root / "helper.py").write_text(
        f"from .consts import SCALE\n\n\ndef f():\n    import {pkg}.lazy\n\n    return SCALE * {pkg}.lazy.X\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        for name in ("helper", "lazy", "unused"):
            __import__(f"{pkg}.{name}")
        deps = user_dependencies(sys.modules[f"{pkg}.helper"])
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == pkg or n.startswith(pkg + ".")]:
            del sys.modules[name]
    files = [f.relative_to(root.resolve()).as_posix() for f in deps]
    assert files == ["helper.py", "__init__.py", "consts.py", "lazy.py"]  # its own first; never unused.py


def test_a_package_the_user_imported_keeps_working_in_their_session(tmp_path: Path) -> None:
    """The model imports ``pkg.layers``; the user's process imported ``pkg`` only. After the build their
    ``pkg`` is their own object and their own ``import pkg.layers`` still works."""
    pkg = _unique("userpkg")
    folder = tmp_path / "proj"
    cfg = write_tiny_project(folder, toml=TINY_TOML.replace("tinynet:build", f"{pkg}.net:build"))
    (folder / pkg).mkdir()
    (folder / pkg / "__init__.py").write_text("")
    (folder / pkg / "layers.py").write_text(RELU)
    (folder / pkg / "net.py").write_text(HELPED_MODEL.format(helper=f"{pkg}.layers"))
    sys.path.insert(0, str(folder))
    try:
        users = __import__(pkg)
        built = edgedeploy.build(cfg, log=_quiet)
        assert sys.modules[pkg] is users
        layers = __import__(f"{pkg}.layers", fromlist=["act"])
        assert users.layers is layers  # the user's own import binds it on their package
        assert str((folder / pkg / "layers.py").resolve()) in _code_files(built.out, "model_code")
    finally:
        sys.path.remove(str(folder))
        for name in [n for n in sys.modules if n == pkg or n.startswith(pkg + ".")]:
            del sys.modules[name]


LAZY_MODEL = textwrap.dedent(
    """
    from torch import nn


    class TinyNet(nn.Module):
        def __init__(self, act, channels: int = 4, classes: int = 5):
            super().__init__()
            self.act = act
            self.conv = nn.Conv2d(3, channels, 3, padding=1)
            self.bn = nn.BatchNorm2d(channels)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(channels, classes)

        def forward(self, image):
            x = self.act(self.bn(self.conv(image)))
            return self.fc(self.pool(x).flatten(1))


    def build(channels: int = 4, classes: int = 5):
        from {helper} import act  # imported when the factory runs, not when its module loads

        return TinyNet(act, channels, classes)
    """
)


@pytest.mark.parametrize("layout", ["package", "module"])
def test_a_helper_the_factory_imports_when_it_runs_is_hashed_and_read_afresh(tmp_path: Path, layout: str) -> None:
    folder = tmp_path / "proj"
    name = _unique("lazy")
    if layout == "package":  # pkg/net.py: from .layers import act, inside build()
        cfg = write_tiny_project(folder, toml=TINY_TOML.replace("tinynet:build", f"{name}.net:build"))
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text("")
        (folder / name / "net.py").write_text(LAZY_MODEL.format(helper=".layers"))
        helper = folder / name / "layers.py"
    else:  # tinynet.py: from <helper> import act, inside build(); the project is not on the user's sys.path
        cfg = write_tiny_project(folder)
        (folder / "tinynet.py").write_text(LAZY_MODEL.format(helper=name))
        helper = folder / f"{name}.py"
    helper.write_text(RELU)
    first = edgedeploy.build(cfg, log=_quiet)
    assert "Relu" in _ops(first.out / "model.onnx")
    assert str(helper.resolve()) in _code_files(first.out, "model_code")

    helper.write_text(TANH)
    second = edgedeploy.build(cfg, log=_quiet)
    assert _status(second)["export"] == "ran", _status(second)
    assert "Tanh" in _ops(second.out / "model.onnx") and "Relu" not in _ops(second.out / "model.onnx")
