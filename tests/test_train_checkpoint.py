"""train.toml validation, checkpoint + metadata contract, and exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edgedeploy.config import checkpoint_metadata_path, config_from_dict
from edgedeploy.errors import CheckpointError, ConfigError
from edgedeploy.train.checkpoint import FORMAT, load_resume_state, resume_paths
from edgedeploy.train.config import load_train_config, train_config_from_dict
from edgedeploy.train.models import digits_cnn
from edgedeploy.train.runner import run_training
from edgedeploy.train.utils import param_diff


def _tiny_cfg(tmp_path, epochs: int = 4, **run):
    rng = np.random.default_rng(0)
    x = rng.random((96, 1, 8, 8), dtype=np.float32)
    y = (x[:, 0, :4].mean(axis=(1, 2)) > x[:, 0, 4:].mean(axis=(1, 2))).astype(np.int64)  # learnable rule
    np.savez(tmp_path / "data.npz", x=x, y=y)
    raw = {
        "model": {"factory": "edgedeploy.train.models:digits_cnn", "kwargs": {"channels": 4, "num_classes": 2}},
        "data": {"dataset": "npz", "path": "data.npz", "batch_size": 16},
        "optim": {"lr": 0.01, "schedule": "onecycle"},
        "monitor": {"memory": False, "every": 5},
        "run": {"epochs": epochs, "device": "cpu", "threads": 1, **run},
        "deploy": {"input_name": "image", "batch": [1, 2, 4]},
    }
    return train_config_from_dict(raw, source="train.toml", base_dir=tmp_path)


def test_train_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'optim\.lrr'") as exc:
        train_config_from_dict({"model": {"factory": "m:f"}, "optim": {"lrr": 1}})
    assert "did you mean 'lr'" in exc.value.one_line()
    with pytest.raises(ConfigError, match=r"'run\.epochs' must be an integer"):
        train_config_from_dict({"model": {"factory": "m:f"}, "run": {"epochs": "ten"}})
    with pytest.raises(ConfigError, match=r"'run\.epochs' = 0 must be >= 1"):
        train_config_from_dict({"model": {"factory": "m:f"}, "run": {"epochs": 0}})
    with pytest.raises(ConfigError, match=r"missing required key 'model\.factory'"):
        train_config_from_dict({"model": {}})
    with pytest.raises(ConfigError, match=r"'data\.path' is required"):
        train_config_from_dict({"model": {"factory": "m:f"}, "data": {"dataset": "npz"}})
    with pytest.raises(ConfigError, match=r"'optim\.schedule' = 'cosin' is not allowed") as exc:
        train_config_from_dict({"model": {"factory": "m:f"}, "optim": {"schedule": "cosin"}})
    assert "did you mean 'cosine'" in exc.value.one_line()
    with pytest.raises(ConfigError, match="not found"):
        load_train_config(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"clip": {"max_norm": 0.5}}, r"'clip\.max_norm' applies to clip\.mode = 'norm', not 'none'"),
        ({"clip": {"mode": "norm", "clip_value": 0.1}}, r"'clip\.clip_value' applies to clip\.mode = 'value'"),
        ({"loss": {"temperature": 2.0}}, r"'loss\.temperature' applies to loss\.kind = 'temperature_ce'"),
        ({"loss": {"export_temperature": "output"}}, r"'loss\.export_temperature' applies to loss\.kind"),
        (
            {"checkpoint": {"monitor": "val_accuracy", "mode": "min"}, "data": {"val_fraction": 0.2}},
            r"'checkpoint\.mode' = 'min' would keep the worst epoch by val_accuracy",
        ),
        ({"checkpoint": {"monitor": "val_loss", "mode": "max"}}, r"'checkpoint\.mode' = 'max' would keep the worst"),
    ],
)
def test_a_key_its_setting_makes_do_nothing_is_refused(section, message):
    """As [data.augment] on arrays: a key that would be ignored (or invert the selection) is a config error."""
    with pytest.raises(ConfigError, match=message):
        train_config_from_dict({"model": {"factory": "m:f"}, **section})
    train_config_from_dict({"model": {"factory": "m:f"}, "clip": {"mode": "norm", "max_norm": 0.5}})  # applies


def test_checkpoint_metadata_contract_and_deploy_config_from_it(tmp_path):
    result = run_training(_tiny_cfg(tmp_path, epochs=1), tmp_path / "run", log=lambda _l: None)
    ckpt = result.checkpoint
    meta = json.loads(checkpoint_metadata_path(ckpt).read_text())
    assert meta["format"] == FORMAT == "edgedeploy-checkpoint/1"
    assert meta["factory"] == "edgedeploy.train.models:digits_cnn"
    assert meta["factory_kwargs"] == {"channels": 4, "num_classes": 2}
    assert meta["inputs"][0]["name"] == "image" and meta["inputs"][0]["shape"] == ["batch", 1, 8, 8]
    lo, hi = meta["inputs"][0]["range"]
    assert lo < 0 < hi  # normalised inputs
    assert meta["dims"] == {"batch": {"min": 1, "opt": 2, "max": 4}}
    assert meta["outputs"] == ["logits"] and meta["class_names"] == ["0", "1"]
    assert set(meta["normalization"]) == {"mean", "std"}
    assert 0.0 <= meta["metrics"]["test_accuracy"] <= 1.0 and meta["metrics"]["epoch"] == 1
    code = meta["code_version"]
    assert code["package"].startswith("edgedeploy ") and len(code["model_source_sha256"]) == 64
    # weights are a plain state dict loadable by the factory's model
    from safetensors.torch import load_file

    model = digits_cnn(channels=4, num_classes=2)
    model.load_state_dict(load_file(str(ckpt)))
    # the deploy side fills factory, inputs, dims, outputs from the sidecar
    cfg = config_from_dict({"model": {"checkpoint": str(ckpt)}, "build": {"target": "cpu"}})
    assert cfg.model.factory == meta["factory"] and cfg.model.kwargs == meta["factory_kwargs"]
    assert cfg.inputs[0].shape == ("batch", 1, 8, 8) and cfg.dims["batch"].max == 4
    assert cfg.outputs == ("logits",)
    # resumable state: tensors in safetensors, the rest in JSON (nothing pickled)
    st, js = resume_paths(ckpt)
    doc = json.loads(js.read_text())
    assert doc["train_state"]["loop"]["epoch"] == 1 and doc["param_groups"]
    assert st.read_bytes()[8:9] == b"{"  # safetensors header, not a pickle


def test_resume_continues_from_the_saved_step_and_matches_an_uninterrupted_run(tmp_path):
    full = run_training(_tiny_cfg(tmp_path, epochs=4), tmp_path / "full", log=lambda _l: None)
    steps_per_epoch = full.state.step // 4
    half = run_training(_tiny_cfg(tmp_path, epochs=4), tmp_path / "half", stop_after=2, log=lambda _l: None)
    assert half.state.step == 2 * steps_per_epoch
    from safetensors.torch import load_file

    half_weights = load_file(str(half.checkpoint))
    lines: list[str] = []
    resumed = run_training(_tiny_cfg(tmp_path, epochs=4), tmp_path / "half", resume=True, log=lines.append)
    assert any("resumed from" in line and f"step {2 * steps_per_epoch}" in line for line in lines)
    assert [h["epoch"] for h in resumed.state.history] == [1, 2, 3, 4]
    assert resumed.state.step == full.state.step
    diff = param_diff(full.checkpoint, resumed.checkpoint)
    assert not diff.changed(atol=1e-6), diff.changed(atol=1e-6)
    # resuming from a fresh run's weights would differ: the comparison has teeth
    assert param_diff(full.checkpoint, half_weights).changed(atol=1e-6)


def test_resume_refuses_missing_or_mismatched_state(tmp_path):
    cfg = _tiny_cfg(tmp_path, epochs=1)
    with pytest.raises(CheckpointError, match="not found"):
        run_training(cfg, tmp_path / "empty", resume=True, log=lambda _l: None)
    result = run_training(cfg, tmp_path / "run", log=lambda _l: None)
    model = digits_cnn(channels=4, num_classes=2)
    with torch.no_grad():
        model.head.bias.add_(1.0)
    from safetensors.torch import load_file, save_file

    st_path, json_path = resume_paths(result.checkpoint)
    older = {k: v for k, v in load_file(str(st_path)).items() if not k.startswith("model.")}
    save_file(older, str(st_path))  # optimizer tensors only, the document in model.resume.json: the older layout
    save_file(model.state_dict(), str(result.checkpoint))  # ... and weights replaced behind its back
    with pytest.raises(CheckpointError, match="other weights"):
        load_resume_state(result.checkpoint, model)
    st_path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_resume_state(result.checkpoint, model)


def test_fp16_scaler_and_learned_temperature_are_saved_and_resumed(tmp_path):
    cfg = _tiny_cfg(tmp_path, epochs=2, precision="fp16")
    cfg = train_config_from_dict(
        {
            "model": {"factory": cfg.model.factory, "kwargs": dict(cfg.model.kwargs)},
            "data": {"dataset": "npz", "path": "data.npz", "batch_size": 16},
            "loss": {"kind": "temperature_ce", "temperature": 1.5, "temperature_lr": 0.05},
            "monitor": {"memory": False},
            "run": {"epochs": 2, "device": "cpu", "threads": 1, "precision": "fp16"},
        },
        source="train.toml",
        base_dir=tmp_path,
    )
    lines: list[str] = []
    first = run_training(cfg, tmp_path / "run", stop_after=1, log=lines.append)
    assert "(fp16)" in lines[0]  # fp16 autocast + GradScaler on CPU, as asked (no silent change)
    saved = json.loads(resume_paths(first.checkpoint)[1].read_text())["train_state"]
    assert saved["amp"]["scaler"]["scale"] > 0
    temperature = saved["loss"]["log_temperature"]
    assert temperature != pytest.approx(np.log(1.5))  # it was learned
    assert first.metrics["temperature"] == pytest.approx(float(np.exp(temperature)), rel=1e-5)
    second = run_training(cfg, tmp_path / "run", resume=True, log=lambda _l: None)
    assert second.state.epoch == 2 and second.state.step == 2 * first.state.step


def test_cli_reports_bad_input_in_one_line_without_partial_output(tmp_path, capsys):
    from edgedeploy.cli import main

    toml = tmp_path / "train.toml"
    toml.write_text('[model]\nfactory = "edgedeploy.train.models:digits_cnn"\n[optim]\nlr = -1.0\n')
    assert main(["train", "--config", str(toml), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "key 'optim.lr' = -1.0 must be > 0" in err and err.count("\n") == 1
    np.savez(tmp_path / "bad.npz", x=np.zeros((4, 1, 8, 8), np.float32))  # no labels
    toml.write_text(
        '[model]\nfactory = "edgedeploy.train.models:digits_cnn"\n'
        '[data]\ndataset = "npz"\npath = "bad.npz"\n[run]\ndevice = "cpu"\n'
    )
    assert main(["train", "--config", str(toml), "--out", str(tmp_path / "out")]) == 3
    assert "has no array 'y'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
