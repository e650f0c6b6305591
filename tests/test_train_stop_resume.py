"""A finished run is finished: early stopping ends it as the last epoch would (temperature folded), resuming it
trains nothing; a resume never runs a schedule sized for another run length; an epoch-end resume continues
Python's and NumPy's generators; best checkpoints deploy as the final one does."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file
from test_train_features import _with
from test_train_resume import _assert_identical

from edgedeploy.errors import CheckpointError
from edgedeploy.train.runner import run_training

QUIET = lambda _line: None  # noqa: E731


def _head_scale(checkpoint, resume_file) -> dict[str, float]:
    """Tensor -> checkpoint / resume-state ratio, for the tensors where the two files differ."""
    deployed, raw = load_file(str(checkpoint)), load_file(str(resume_file))
    out = {}
    for key, value in deployed.items():
        twin = raw.get(f"model.{key}", raw.get(key))
        if twin is not None and not torch.equal(value, twin):
            out[key] = float((value.double() / twin.double()).mean())
    return out


def test_an_early_stopped_run_is_finished_its_temperature_folded_and_a_resume_trains_nothing(tmp_path):
    cfg = _with(
        tmp_path, loss={"kind": "temperature_ce"}, data={"val_fraction": 0.25},
        run={"epochs": 10, "early_stop_patience": 1},
    )  # fmt: skip
    lines: list[str] = []
    first = run_training(cfg, tmp_path / "run", log=lines.append)
    assert first.state.stopped_early and first.state.epoch < 10 and any("early stop" in x for x in lines)
    meta = json.loads(first.checkpoint.with_suffix(".meta.json").read_text())
    T = meta["temperature"]["value"]
    assert meta["temperature"]["export"] == "fold" and T != 1.0
    # the deployed head is the trained one divided by T: its weight and bias, nothing else
    scales = _head_scale(first.checkpoint, tmp_path / "run" / "model.resume.safetensors")
    assert len(scales) == 2 and all(s == pytest.approx(1 / T, rel=1e-4) for s in scales.values()), scales
    before = first.checkpoint.read_bytes()
    lines.clear()
    again = run_training(cfg, tmp_path / "run", resume=True, log=lines.append)
    assert again.state.epoch == first.state.epoch and any("nothing left to train" in x for x in lines)
    assert first.checkpoint.read_bytes() == before


def test_a_resume_that_asks_for_another_run_length_is_refused_in_one_line(tmp_path):
    cfg = _with(tmp_path, optim={"schedule": "cosine"}, run={"epochs": 2})
    run_training(cfg, tmp_path / "run", log=QUIET)
    longer = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, epochs=4))
    with pytest.raises(CheckpointError, match=r"cosine LR schedule is sized for 2 epochs \(16 steps\); this run asks"):
        run_training(longer, tmp_path / "run", resume=True, log=QUIET)
    try:
        run_training(longer, tmp_path / "run", resume=True, log=QUIET)
    except CheckpointError as exc:
        assert exc.hint is not None and exc.hint.startswith("resume with --epochs 2")


AUGMENTED = """
import random

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset


class Noisy(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):  # augmentation drawn from NumPy's and Python's generators, not torch's
        noise = np.random.normal(size=self.x[i].shape).astype(np.float32) * random.random() * 0.1
        return self.x[i] + torch.from_numpy(noise), self.y[i]


def sets():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(48, 1, 8, 8, generator=g)
    y = (x[:, 0, :4].mean((1, 2)) > x[:, 0, 4:].mean((1, 2))).long()
    return Noisy(x[:32], y[:32]), TensorDataset(x[32:], y[32:]), {"class_names": ["a", "b"]}
"""


def test_an_epoch_end_resume_continues_numpy_and_python_augmentation_exactly(tmp_path):
    (tmp_path / "augmented.py").write_text(AUGMENTED)
    cfg = _with(tmp_path, data={"dataset": "callable", "callable": "augmented:sets", "path": None}, run={"epochs": 3})
    whole = run_training(cfg, tmp_path / "whole", log=QUIET)
    run_training(cfg, tmp_path / "sliced", stop_after=1, log=QUIET)
    sliced = run_training(cfg, tmp_path / "sliced", resume=True, log=QUIET)
    _assert_identical(load_file(str(whole.checkpoint)), load_file(str(sliced.checkpoint)))


def test_best_checkpoints_deploy_as_the_final_one_does(tmp_path):
    cfg = _with(
        tmp_path, loss={"kind": "temperature_ce", "temperature": 2.0, "temperature_lr": 0.05},
        checkpoint={"save_best": True, "monitor": "train_loss", "mode": "min"}, run={"epochs": 2},
    )  # fmt: skip
    result = run_training(cfg, tmp_path / "run", log=QUIET)
    final_meta = json.loads(result.checkpoint.with_suffix(".meta.json").read_text())
    best = tmp_path / "run" / "model.best.safetensors"
    best_meta = json.loads(best.with_suffix(".meta.json").read_text())
    assert best_meta["selection"]["epoch"] == 2  # the final epoch: the two files hold the same model
    assert best_meta["temperature"] == final_meta["temperature"] and best_meta["temperature"]["export"] == "fold"
    _assert_identical(load_file(str(best)), load_file(str(result.checkpoint)))
    assert best_meta["deploy_data"] == final_meta["deploy_data"] and best_meta["deploy_data"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run of 2 epochs with a cosine schedule and a learned, folded temperature: (config, folder)."""
    tmp = tmp_path_factory.mktemp("edited")
    cfg = _with(tmp, optim={"schedule": "cosine"}, loss={"kind": "temperature_ce"}, run={"epochs": 2})
    run_training(cfg, tmp / "run", stop_after_steps=5, log=QUIET)  # mid-epoch: the RNG and batching matter
    return cfg, tmp / "run"


def _edit_state(folder, edit) -> None:
    """Rewrite the JSON state in ``model.resume.safetensors``'s header with ``edit(doc)`` applied."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from edgedeploy.train.checkpoint import _DOC_KEY

    path = folder / "model.resume.safetensors"
    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata())
    tensors = load_file(str(path))
    doc = json.loads(meta[_DOC_KEY])
    edit(doc["train_state"])
    meta[_DOC_KEY] = json.dumps(doc)
    save_file(tensors, str(path), metadata=meta)


def _set(path: str, value):  # type: ignore[no-untyped-def]
    def edit(state):  # type: ignore[no-untyped-def]
        *parents, last = path.split(".")
        node = state
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (_set("loop.epoch", "x"), "loop.epoch"),
        (_set("rng.0.torch", [1, 2, 3]), "rng[0]"),
        (lambda state: [f.update(total="16") for f in state["scheduler"]["lr_lambdas"]], "scheduler"),
        (_set("amp.steps", "many"), "amp.steps"),
        (_set("loss", {"weight": [1.0]}), "loss"),
        (_set("schedule.optimizer", "SGD"), "saved by a run with the SGD optimizer"),
        (_set("schedule.batch_size", 4), "saved mid-epoch with batch_size 4"),
        (_set("schedule.device", "cuda"), "saved by a run training on cuda; this run trains on cpu"),
        (_set("schedule.precision", "fp16"), "saved by a run training in fp16; this run trains in fp32"),
    ],
)
def test_a_hand_edited_resume_state_fails_in_one_line_naming_the_field(finished_run, tmp_path, edit, field):
    import shutil

    cfg, folder = finished_run
    copy = tmp_path / "run"
    shutil.copytree(folder, copy)
    _edit_state(copy, edit)
    with pytest.raises(CheckpointError) as caught:
        run_training(cfg, copy, resume=True, log=QUIET)
    assert field in str(caught.value), str(caught.value)


def test_an_unedited_state_still_resumes(finished_run, tmp_path):
    import shutil

    cfg, folder = finished_run
    shutil.copytree(folder, tmp_path / "run")
    _edit_state(tmp_path / "run", lambda state: None)  # rewritten, unchanged
    assert run_training(cfg, tmp_path / "run", resume=True, log=QUIET).state.epoch == 2


def test_a_diverged_runs_sidecar_is_strict_json_with_no_figure_for_a_nan_loss(tmp_path):
    cfg = _with(tmp_path, optim={"lr": 1e30}, run={"epochs": 1})
    result = run_training(cfg, tmp_path / "run", log=QUIET)
    text = result.checkpoint.with_suffix(".meta.json").read_text()
    meta = json.loads(text, parse_constant=lambda token: pytest.fail(f"non-JSON token {token} in the sidecar"))
    assert meta["metrics"]["train_loss"] is None


def test_a_config_the_factory_cannot_follow_fails_before_anything_is_written(tmp_path):
    from edgedeploy.errors import ConfigError

    cfg = _with(
        tmp_path, loss={"kind": "temperature_ce", "export_temperature": "output"}, monitor={"tensorboard": True}
    )  # the test net's factory takes no temperature= keyword
    lines: list[str] = []
    with pytest.raises(ConfigError, match="needs a factory with a temperature= keyword"):
        run_training(cfg, tmp_path / "run", log=lines.append)
    assert not (tmp_path / "run" / "tensorboard").exists() and not any("deploy train:" in x for x in lines)


def test_resuming_with_another_model_names_the_first_tensor_that_differs(finished_run, tmp_path):
    import shutil

    cfg, folder = finished_run
    shutil.copytree(folder, tmp_path / "run")
    mlp = dataclasses.replace(cfg.model, factory="edgedeploy.train.models:mlp", kwargs={"in_features": 64})
    other = dataclasses.replace(cfg, model=mlp)
    with pytest.raises(CheckpointError, match=r"does not fit the model: the model's \S+ is not in the checkpoint"):
        run_training(other, tmp_path / "run", resume=True, log=QUIET)


def test_augmentation_for_data_it_cannot_apply_to_is_refused(tmp_path):
    from edgedeploy.errors import ConfigError

    with pytest.raises(ConfigError, match=r"\[data.augment\] \(hflip\) applies to image files"):
        _with(tmp_path, data={"augment": {"hflip": 0.5}})  # npz arrays: nothing applies it


NOISY = """
import random

import torch
from torch import nn
from torch.utils.data import Dataset


def net(num_classes=3):
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, num_classes))


class Noisy(Dataset):
    def __init__(self, x, y, augment):
        self.x, self.y, self.augment = x, y, augment

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):  # augmentation from Python's global generator
        return (self.x[i] + 0.05 * random.random() if self.augment else self.x[i]), self.y[i]


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 1, 4, 4, generator=g)
    y = x.flatten(1)[:, :3].argmax(1)
    return Noisy(x[:96], y[:96], True), Noisy(x[96:], y[96:], False), {"num_classes": 3}
"""


def test_a_best_checkpoint_written_mid_run_leaves_an_exact_resume_exact(tmp_path):
    """Writing the deploy samples with the first best checkpoint runs the dataset's augmentation: the global
    generators are put back, so a run stopped and resumed ends bit for bit where the straight run ends."""
    from edgedeploy.train.config import train_config_from_dict

    (tmp_path / "noisy_data.py").write_text(NOISY)
    raw = {
        "model": {"factory": "noisy_data:net", "python_path": ["."], "kwargs": {"num_classes": 3}},
        "data": {"dataset": "callable", "callable": "noisy_data:data", "batch_size": 16, "val_fraction": 0.25},
        "checkpoint": {"monitor": "val_loss", "save_best": True},
        "monitor": {"memory": False},
        "run": {"epochs": 3, "device": "cpu", "threads": 1},
    }
    cfg = train_config_from_dict(raw, source="train.toml", base_dir=tmp_path)
    straight = run_training(cfg, tmp_path / "straight", log=QUIET)
    run_training(cfg, tmp_path / "resumed", stop_after=1, log=QUIET)
    resumed = run_training(cfg, tmp_path / "resumed", resume=True, log=QUIET)
    _assert_identical(load_file(str(straight.checkpoint)), load_file(str(resumed.checkpoint)))


def test_a_mid_epoch_stop_records_where_its_weights_are_not_the_last_epochs_figures(tmp_path):
    cfg = _with(tmp_path, run={"epochs": 3})
    result = run_training(cfg, tmp_path / "run", stop_after_steps=10, log=QUIET)  # 8 steps an epoch: mid epoch 2
    meta = json.loads(result.checkpoint.with_suffix(".meta.json").read_text())
    assert {k: meta["metrics"][k] for k in ("epoch", "step", "batch")} == {"epoch": 1, "step": 10, "batch": 2}
    assert "test_accuracy" not in meta["metrics"] and "train_loss" not in meta["metrics"]


def test_a_data_callables_input_range_covers_its_samples_not_the_first_ones(tmp_path):
    from edgedeploy.train.config import train_config_from_dict

    (tmp_path / "noisy_data.py").write_text(NOISY)
    raw = {
        "model": {"factory": "noisy_data:net", "python_path": ["."], "kwargs": {"num_classes": 3}},
        "data": {"dataset": "callable", "callable": "noisy_data:data", "batch_size": 16},
        "monitor": {"memory": False},
        "run": {"epochs": 1, "device": "cpu", "threads": 1},
    }
    result = run_training(train_config_from_dict(raw, source="t.toml", base_dir=tmp_path), tmp_path / "r", log=QUIET)
    meta = json.loads(result.checkpoint.with_suffix(".meta.json").read_text())
    lo, hi = meta["inputs"][0]["range"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 1, 4, 4, generator=g)
    # every sample read (training ones with their augmentation, up to +0.05), not the first test sample's span
    assert lo <= float(x.min()) + 0.05 and hi >= float(x.max()), (lo, hi, float(x.min()), float(x.max()))
    assert lo < float(x[96].min()) - 1 and hi > float(x[96].max()) + 1
