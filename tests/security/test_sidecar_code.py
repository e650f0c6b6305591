"""A checkpoint's .meta.json sidecar is untrusted data: it must never choose code that gets imported or called."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgedeploy.config import config_from_dict, load_config
from edgedeploy.errors import CheckpointError, ConfigError
from edgedeploy.modelio.usercode import import_factory

HOSTILE = [
    ("os:system", {"command": "touch PWNED"}),
    ("subprocess:call", {"args": ["touch", "PWNED"]}),
    ("subprocess:Popen", {"args": ["touch", "PWNED"]}),
]


def _sidecar(folder: Path, factory: str, kwargs: dict, **extra) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
    meta = {
        "format": "edgedeploy-checkpoint/1",
        "factory": factory,
        "factory_kwargs": kwargs,
        "inputs": [{"name": "x", "shape": ["b", 4]}],
        "dims": {"b": {"min": 1, "opt": 1, "max": 2}},
        "outputs": ["y"],
        **extra,
    }
    (folder / "model.meta.json").write_text(json.dumps(meta))
    cfg = folder / "deploy.toml"
    cfg.write_text('[model]\ncheckpoint = "model.safetensors"\n[build]\nout = "out"\n')
    return cfg


@pytest.mark.parametrize(("factory", "kwargs"), HOSTILE)
def test_hostile_sidecar_factory_is_refused_at_config_time(tmp_path, factory, kwargs):
    cfg = _sidecar(tmp_path, factory, kwargs)
    with pytest.raises(ConfigError, match="may not choose code to run"):
        load_config(cfg)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(("factory", "kwargs"), HOSTILE)
def test_trusting_the_sidecar_still_confines_it_to_the_projects_own_modules(tmp_path, factory, kwargs):
    cfg = _sidecar(tmp_path, factory, kwargs)
    with pytest.raises(ConfigError, match="inside model.python_path"):
        load_config(cfg, overrides={"model.trust_sidecar_code": True})
    assert not (tmp_path / "PWNED").exists()


def test_trusted_sidecar_may_not_name_a_reexported_library_callable(tmp_path):
    cfg = _sidecar(tmp_path, "proj_models:system", {"command": "touch PWNED"})
    (tmp_path / "proj_models.py").write_text("from os import system\n")
    loaded = load_config(cfg, overrides={"model.trust_sidecar_code": True})
    with pytest.raises(ConfigError, match="not a function or class defined in"):
        import_factory(loaded)
    assert not (tmp_path / "PWNED").exists()


def test_cli_build_and_check_with_hostile_sidecar_leave_no_trace(tmp_path):
    cfg = _sidecar(tmp_path, "os:system", {"command": "touch PWNED"})
    for cmd in ("build", "check"):
        proc = subprocess.run(
            [sys.executable, "-m", "edgedeploy", cmd, "--config", str(cfg)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, proc.stderr  # ConfigError's exit code
        assert "may not choose code to run" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "PWNED").exists()
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_package_zoo_factory_from_sidecar_needs_no_trust(tmp_path):
    cfg = _sidecar(tmp_path, "edgedeploy.train.models:digits_cnn", {"channels": 4, "num_classes": 2})
    loaded = load_config(cfg)
    assert loaded.factory_origin == "package"
    assert callable(import_factory(loaded))


def test_config_factory_wins_and_sidecar_kwargs_do_not_leak_into_it(tmp_path):
    cfg = _sidecar(tmp_path, "os:system", {"command": "touch PWNED"})
    cfg.write_text('[model]\ncheckpoint = "model.safetensors"\nfactory = "edgedeploy.train.models:digits_cnn"\n')
    loaded = load_config(cfg)
    assert loaded.factory_origin == "config" and loaded.model.kwargs == {}


def test_sidecar_with_wrong_format_or_shape_is_refused(tmp_path):
    cfg = _sidecar(tmp_path, "edgedeploy.train.models:digits_cnn", {}, format="something-else/9")
    with pytest.raises(ConfigError, match="format"):
        load_config(cfg)
    (tmp_path / "model.meta.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        load_config(cfg)


def test_weights_that_do_not_match_the_sidecar_hash_are_refused(tmp_path):
    from edgedeploy.modelio.checkpoint import verify_sidecar_hash

    _sidecar(tmp_path, "edgedeploy.train.models:digits_cnn", {}, weights_sha256="0" * 64)
    with pytest.raises(CheckpointError, match="does not match the weights_sha256"):
        verify_sidecar_hash(tmp_path / "model.safetensors")
    cfg = config_from_dict({"model": {"checkpoint": str(tmp_path / "model.safetensors")}})
    assert cfg.model.factory == "edgedeploy.train.models:digits_cnn"
