"""One deploy contract for any trainer: export_for_deploy from our runner's data, a Lightning callback and a
Hugging Face Trainer callback, each into `deploy build --precision int8` without a hand-written input spec."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

QUIET = lambda _line: None  # noqa: E731


def _digit_loaders():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.from_numpy(((d.images / 16.0 - 0.3) / 0.4).astype(np.float32))[:, None][:400]
    y = torch.from_numpy(d.target.astype(np.int64))[:400]
    g = torch.Generator().manual_seed(0)
    train = DataLoader(TensorDataset(x[:320], y[:320]), batch_size=32, shuffle=True, generator=g)
    return train, DataLoader(TensorDataset(x[320:], y[320:]), batch_size=40)


def _build_int8(tmp_path, ckpt):
    import edgedeploy

    stem = ckpt.with_suffix("")
    (tmp_path / "deploy.toml").write_text(
        f'[model]\ncheckpoint = "{ckpt}"\n[precision]\nmode = "int8"\ncalib = "{stem}.calib.npz"\n'
        f'[validate]\ndata = "{stem}.validate.npz"\nsamples = 0\nclassifier_outputs = ["logits"]\n'
        f'[build]\ntarget = "cpu"\nout = "{tmp_path / "cpu"}"\n'
    )
    return edgedeploy.build(tmp_path / "deploy.toml", log=QUIET)


def test_export_for_deploy_derives_the_contract_from_an_example_batch(tmp_path):
    from edgedeploy.train import export_for_deploy
    from edgedeploy.train.models import digits_cnn

    train, val = _digit_loaders()
    model = digits_cnn(channels=4, num_classes=10)
    path = export_for_deploy(
        model, next(iter(train)), tmp_path / "m.safetensors", factory="edgedeploy.train.models:digits_cnn",
        factory_kwargs={"channels": 4, "num_classes": 10}, data=train.dataset, validation=val, batch=(1, 4, 16),
        normalization={"mean": [0.3], "std": [0.4]},
    )  # fmt: skip
    meta = json.loads(path.with_suffix(".meta.json").read_text())
    assert meta["inputs"] == [
        {"name": "x", "shape": ["batch", 1, 8, 8], "dtype": "float32", "range": meta["inputs"][0]["range"]}
    ]
    lo, hi = meta["inputs"][0]["range"]
    assert lo <= -0.75 and hi >= 1.75  # the data's (x - 0.3) / 0.4 range is covered
    assert meta["outputs"] == ["logits"] and meta["dims"]["batch"] == {"min": 1, "opt": 4, "max": 16}
    calib, held = np.load(tmp_path / "m.calib.npz"), np.load(tmp_path / "m.validate.npz")
    assert calib["x"].shape == (128, 1, 8, 8) and held["x"].shape == (16, 1, 8, 8)
    assert np.array_equal(held["x"], val.dataset.tensors[0][:16].numpy())  # the held-out samples, in order
    assert meta["deploy_data"] == {"calib": "m.calib.npz", "validate": "m.validate.npz"}


@pytest.mark.slow
def test_lightning_callback_checkpoint_builds_int8_without_an_input_spec(tmp_path):
    pytest.importorskip("lightning")
    import lightning.pytorch as pl

    from edgedeploy.train.lightning import deploy_checkpoint_callback, lightning_module
    from edgedeploy.train.models import digits_cnn

    torch.manual_seed(0)
    train, val = _digit_loaders()
    ckpt = tmp_path / "run" / "model.safetensors"
    kwargs = {"channels": 8, "num_classes": 10}
    trainer = pl.Trainer(
        max_epochs=6, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[deploy_checkpoint_callback(ckpt, factory="edgedeploy.train.models:digits_cnn",
                                              factory_kwargs=kwargs)],  # the two extra lines
    )  # fmt: skip
    trainer.fit(lightning_module(digits_cnn(**kwargs), lr=0.01), train, val)
    meta = json.loads(ckpt.with_suffix(".meta.json").read_text())
    assert meta["trainer"] == "lightning" and meta["inputs"][0]["shape"] == ["batch", 1, 8, 8]
    assert meta["metrics"]["val_accuracy"] > 0.5, meta["metrics"]  # 10 classes: chance is 0.1
    built = _build_int8(tmp_path, ckpt)
    assert built.ok and built.report["status"] == "passed" and built.report["precision"] == "int8", built.report


class _Texts(torch.utils.data.Dataset):
    """Sentences labelled by whether they say "good" (1) or "bad" (0), tokenized to 16 positions."""

    def __init__(self, tokenizer, sentences):
        enc = tokenizer(sentences, padding="max_length", truncation=True, max_length=16, return_tensors="pt")
        self.items = [
            {"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
             "labels": torch.tensor(int("good" in s))}
            for i, s in enumerate(sentences)
        ]  # fmt: skip

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _labelled_sentences(transformers, tmp_path, count):  # type: ignore[no-untyped-def]
    """A tiny WordPiece tokenizer and ``count`` sentences whose label is the word "good" or "bad" in them."""
    from hf_tiny import save_tokenizer

    save_tokenizer(tmp_path / "tok")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok", local_files_only=True)
    rng = np.random.default_rng(0)
    words = ["the", "cat", "dog", "sat", "on", "mat", "is", "and"]
    return tokenizer, [
        " ".join([*rng.choice(words, 4), ["good", "bad"][i % 2], *rng.choice(words, 3)]) for i in range(count)
    ]


@pytest.mark.slow
def test_hf_trainer_callback_checkpoint_builds_int8_without_an_input_spec(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from hf_tiny import VOCAB

    from edgedeploy.train.hf import deploy_callback

    tokenizer, sentences = _labelled_sentences(transformers, tmp_path, 96)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32, num_labels=2,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    ckpt = tmp_path / "run" / "model.safetensors"
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), num_train_epochs=6, per_device_train_batch_size=16, learning_rate=5e-3,
        report_to=[], save_strategy="no", use_cpu=True, logging_steps=5, eval_strategy="epoch", seed=0,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=_Texts(tokenizer, sentences[:64]),
        eval_dataset=_Texts(tokenizer, sentences[64:]),
        callbacks=[deploy_callback(ckpt)],  # the two extra lines: this and the import
    )  # fmt: skip
    trainer.train()
    meta = json.loads(ckpt.with_suffix(".meta.json").read_text())
    assert meta["factory"] == "edgedeploy.train.models:hf_sequence_classifier"
    assert [(i["name"], i["dtype"], i["shape"]) for i in meta["inputs"]] == [
        ("input_ids", "int64", ["batch", 16]), ("attention_mask", "int64", ["batch", 16])
    ]  # fmt: skip
    assert meta["inputs"][0]["range"] == [0, len(VOCAB) - 1]
    assert meta["metrics"]["eval_loss"] < 0.6, meta["metrics"]  # it learned "good" vs "bad"
    held = np.load(ckpt.with_suffix("").with_name("model.validate.npz"))
    assert held["input_ids"].shape == (32, 16)
    built = _build_int8(tmp_path, ckpt)
    assert built.ok and built.report["status"] == "passed" and built.report["precision"] == "int8", built.report


# ---- the one deploy command on the folder a bridge wrote -------------------------------------------------


def _deploy(*argv):
    """`deploy ARGV` in this process: exit code (stdout/stderr go to capsys)."""
    from edgedeploy.cli import main

    return main(list(argv))


def _int8_nodes(onnx_path):
    import onnx

    ops = [n.op_type for n in onnx.load(str(onnx_path)).graph.node]
    return [op for op in ops if op in INT8_OPS]


INT8_OPS = ("QuantizeLinear", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul")


def _check_bridge_build(out, run, trainer):
    import jsonschema

    report = json.loads((out / "report.json").read_text())
    schema = json.loads((Path(__file__).resolve().parents[1] / "docs" / "report.schema.json").read_text())
    jsonschema.validate(report, schema)
    assert report["status"] == "passed" and report["precision"] == "int8", report.get("error")
    calib, held = run / "model.calib.npz", run / "model.validate.npz"
    assert report["data_sources"] == {
        "calibration": f"written by export_for_deploy ({trainer}) at {calib}",
        "validation": f"written by export_for_deploy ({trainer}) at {held}",
    }
    assert report["metrics"]["precision"]["calibration"]["location"] == str(calib)
    assert "data" in report["parity"]["shapes"]  # judged on the held-out samples the bridge wrote
    assert _int8_nodes(out / report["model"]["artifact"]), report["model"]
    return report


def _digits_lightning_module(**kwargs):
    """A LightningModule as users write them: the network is an attribute (``self.net``), not ``.model``."""
    import lightning.pytorch as pl

    from edgedeploy.train.models import digits_cnn

    class DigitsModule(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = digits_cnn(**kwargs)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_accuracy", (self(x).argmax(-1) == y).float().mean())

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    return DigitsModule()


def test_lightning_bridge_folder_builds_int8_with_one_command(tmp_path, capsys, monkeypatch):
    pytest.importorskip("lightning")
    import lightning.pytorch as pl

    from edgedeploy.train.lightning import deploy_checkpoint_callback

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    train, val = _digit_loaders()
    kwargs = {"channels": 4, "num_classes": 10}
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[deploy_checkpoint_callback("run/model.safetensors", factory="edgedeploy.train.models:digits_cnn",
                                              factory_kwargs=kwargs)],
    )  # fmt: skip
    trainer.fit(_digits_lightning_module(**kwargs), train, val)
    code = _deploy("build", "--checkpoint", "run/", "--target", "cpu", "--precision", "int8")
    printed = capsys.readouterr()
    assert code == 0, printed.err[-2000:]
    run = tmp_path / "run"
    _check_bridge_build(tmp_path / "build", run, "lightning")  # --out defaults to ./build
    assert f"calibration: written by export_for_deploy (lightning) at {run / 'model.calib.npz'}" in printed.out


def test_hf_trainer_bridge_folder_builds_int8_with_one_command(tmp_path, capsys, monkeypatch):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from hf_tiny import VOCAB

    from edgedeploy.train.hf import deploy_callback

    tokenizer, sentences = _labelled_sentences(transformers, tmp_path, 48)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32, num_labels=2,
    )  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), num_train_epochs=1, per_device_train_batch_size=16, report_to=[],
        save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0, eval_strategy="epoch",
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=transformers.BertForSequenceClassification(config), args=args,
        train_dataset=_Texts(tokenizer, sentences[:32]), eval_dataset=_Texts(tokenizer, sentences[32:]),
        callbacks=[deploy_callback("run/model.safetensors")],
    )  # fmt: skip
    monkeypatch.chdir(tmp_path)
    trainer.train()
    code = _deploy("build", "--checkpoint", "run/", "--target", "cpu", "--precision", "int8")
    printed = capsys.readouterr()
    assert code == 0, printed.err[-2000:]
    _check_bridge_build(tmp_path / "build", tmp_path / "run", "hf_trainer")


@pytest.fixture
def exported(tmp_path):
    """An (untrained) digits CNN written by export_for_deploy into tmp_path/run, as a bridge writes it."""
    from edgedeploy.train import export_for_deploy
    from edgedeploy.train.models import digits_cnn

    train, val = _digit_loaders()
    export_for_deploy(
        digits_cnn(channels=4, num_classes=10), next(iter(train)), tmp_path / "run" / "model.safetensors",
        factory="edgedeploy.train.models:digits_cnn", factory_kwargs={"channels": 4, "num_classes": 10},
        data=train.dataset, validation=val, batch=(1, 4, 16),
    )  # fmt: skip
    return tmp_path / "run"


def _refused(tmp_path, capsys, run, *extra):
    code = _deploy("build", "--checkpoint", str(run), "--target", "cpu", "--precision", "int8",
                   "--out", str(tmp_path / "out"), *extra)  # fmt: skip
    err = capsys.readouterr().err
    verdict = [line for line in err.splitlines() if line.startswith("deploy: ")]
    assert len(verdict) == 1 and "Traceback" not in err, err  # one line, no traceback
    assert not (tmp_path / "out" / "report.json").exists()
    return code, verdict[0]


def test_missing_exported_calibration_file_is_one_line_naming_it_and_the_fix(tmp_path, capsys, exported):
    (exported / "model.calib.npz").unlink()
    code, line = _refused(tmp_path, capsys, exported)
    assert code == 3
    assert f"precision.calib: {exported / 'model.calib.npz'} not found" in line
    assert str(exported / "model.meta.json") in line and "--calib FILE" in line


def test_changed_exported_calibration_file_is_refused_before_it_is_read(tmp_path, capsys, exported):
    calib = exported / "model.calib.npz"
    with calib.open("ab") as fh:
        fh.write(b"tampered")
    code, line = _refused(tmp_path, capsys, exported)
    assert code == 3 and f"{calib} changed after export_for_deploy wrote it" in line and "--calib FILE" in line


def test_pickled_samples_with_a_forged_hash_are_never_unpickled(tmp_path, capsys, exported):
    from edgedeploy.fileio.hashing import sha256_file

    held = exported / "model.validate.npz"
    objects = np.empty((4, 1, 8, 8), dtype=object)
    objects.fill({"boom": 1})
    np.savez(held, x=objects)  # an object array is stored as a pickle
    meta_path = exported / "model.meta.json"
    meta = json.loads(meta_path.read_text())
    meta["deploy_data_sha256"]["validate"] = sha256_file(held)  # whoever edits the file may edit the sidecar
    meta_path.write_text(json.dumps(meta))
    code, line = _refused(tmp_path, capsys, exported)
    assert code == 3 and str(held) in line and "Python objects" in line, line


def test_sidecar_data_names_stay_next_to_the_checkpoint(tmp_path, capsys, exported):
    meta_path = exported / "model.meta.json"
    meta = json.loads(meta_path.read_text())
    meta["deploy_data"]["calib"] = "../elsewhere.npz"
    meta_path.write_text(json.dumps(meta))
    code, line = _refused(tmp_path, capsys, exported)
    assert code == 2 and "deploy_data.calib = '../elsewhere.npz'" in line and "file name next to" in line


def test_explicit_data_flags_win_over_the_exported_samples(tmp_path, exported):
    import edgedeploy
    from edgedeploy.pipeline.report import data_sources

    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros((4, 1, 8, 8), np.float32))
    cfg = edgedeploy.load_config(_toml(tmp_path, f'[model]\ncheckpoint = "{exported}"\n'), precision__mode="int8")
    assert cfg.model.checkpoint == str(exported / "model.safetensors") and cfg.validate.samples == 0
    assert data_sources(cfg)["calibration"].startswith("written by export_for_deploy (custom) at ")
    cfg = edgedeploy.load_config(
        _toml(tmp_path, f'[model]\ncheckpoint = "{exported}"\n[validate]\ndata = "{other}"\n'),
        precision__mode="int8", precision__calib=str(other),
    )  # fmt: skip
    assert cfg.data_origins == {} and cfg.validate.samples == 2
    assert data_sources(cfg) == {
        "calibration": f"precision.calib at {other}",
        "validation": f"validate.data at {other}",
    }
    fp32 = edgedeploy.load_config(_toml(tmp_path, f'[model]\ncheckpoint = "{exported}"\n'))
    assert fp32.precision.calib is None and list(fp32.data_origins) == ["validate.data"]


def _toml(tmp_path, text):
    path = tmp_path / "deploy.toml"
    path.write_text(text)
    return path


def test_a_folder_with_two_checkpoints_or_none_names_them(tmp_path, capsys, exported):
    import shutil

    for name in ("model.safetensors", "model.meta.json"):
        shutil.copy(exported / name, exported / name.replace("model", "best"))
    code, line = _refused(tmp_path, capsys, exported)
    assert code == 2 and "holds 2 checkpoints (best.safetensors, model.safetensors)" in line
    assert f"--checkpoint {exported / 'best.safetensors'}" in line
    code, line = _refused(tmp_path, capsys, tmp_path / "out")
    assert code == 2 and "has no .meta.json sidecar describing the model" in line


def test_building_a_loaded_config_with_keywords_keeps_where_its_data_came_from(tmp_path, exported):
    import edgedeploy
    from edgedeploy.errors import InputError

    cfg = edgedeploy.load_config(_toml(tmp_path, f'[model]\ncheckpoint = "{exported}"\n'), precision__mode="int8")
    (exported / "model.calib.npz").unlink()
    with pytest.raises(InputError, match="model.meta.json lists it as the calibration data export_for_deploy wrote"):
        edgedeploy.build(cfg, build__out=str(tmp_path / "out"), log=QUIET)  # keywords re-read the config


def test_a_factory_that_cannot_rebuild_the_model_is_refused_at_export_time(tmp_path):
    from edgedeploy.errors import ConfigError
    from edgedeploy.train import export_for_deploy
    from edgedeploy.train.models import digits_cnn

    train, _ = _digit_loaders()
    model = digits_cnn(channels=4, num_classes=10)
    kwargs = {"factory": "edgedeploy.train.models:digits_cnn", "factory_kwargs": {"channels": 8, "num_classes": 10}}
    with pytest.raises(ConfigError, match=r"does not rebuild the model being exported \(other shapes: \["):
        export_for_deploy(model, next(iter(train)), tmp_path / "m.safetensors", **kwargs)
    wrapped = torch.nn.Sequential(model)  # keys "0.stem..." where the factory's model has "stem..."
    with pytest.raises(ConfigError, match=r"not in the weights: \['"):
        export_for_deploy(wrapped, next(iter(train)), tmp_path / "m.safetensors", **{**kwargs, "factory_kwargs": {}})
    with pytest.raises(ConfigError, match="factory 'nowhere:build' does not import"):
        export_for_deploy(model, next(iter(train)), tmp_path / "m.safetensors", factory="nowhere:build")
    assert not list(tmp_path.iterdir())  # refused before anything is written


def test_your_own_factory_is_named_by_you_and_keeps_the_sidecars_kwargs(tmp_path, monkeypatch, request):
    import sys

    from edgedeploy.cli import build_parser
    from edgedeploy.commands._common import config_from_args
    from edgedeploy.errors import ConfigError
    from edgedeploy.train import export_for_deploy

    (tmp_path / "mynet.py").write_text(
        "from torch import nn\n\ndef build(hidden=8):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    request.addfinalizer(lambda: sys.modules.pop("mynet", None))
    monkeypatch.chdir(tmp_path)
    import mynet

    train, val = _digit_loaders()
    export_for_deploy(mynet.build(hidden=16), next(iter(train)), "run/model.safetensors", factory="mynet:build",
                      factory_kwargs={"hidden": 16}, data=train.dataset, validation=val)  # fmt: skip
    parse = build_parser().parse_args
    with pytest.raises(ConfigError, match="may not choose code to run") as refused:
        config_from_args(parse(["build", "--checkpoint", "run/", "--precision", "int8"]))
    assert "--factory mynet:build" in refused.value.one_line()
    cfg = config_from_args(parse(["build", "--checkpoint", "run/", "--precision", "int8", "--factory", "mynet:build"]))
    assert cfg.model.kwargs == {"hidden": 16} and [i.name for i in cfg.inputs] == ["input"]
    assert cfg.precision.calib == str(tmp_path / "run" / "model.calib.npz")


def train_digits(tmp_path, **run):
    """``deploy train``'s runner, 3 epochs of a 4-channel CNN on 600 digits, into ``tmp_path / "run"`` (returned);
    ``run``: the config's [run] keys besides epochs."""
    from sklearn.datasets import load_digits

    from edgedeploy.train.config import train_config_from_dict
    from edgedeploy.train.runner import run_training

    digits = load_digits()
    images = (digits.images[:600] / 16.0).astype(np.float32)[:, None]
    np.savez(tmp_path / "d.npz", x=images, y=digits.target[:600])
    raw = {
        "model": {"factory": "edgedeploy.train.models:digits_cnn", "kwargs": {"channels": 4, "num_classes": 10}},
        "data": {"dataset": "npz", "path": "d.npz"},
        "optim": {"lr": 0.01},
        "monitor": {"memory": False},
        "run": {"epochs": 3, **run},
    }
    cfg = train_config_from_dict(raw, source=str(tmp_path / "train.toml"), base_dir=tmp_path)
    run_training(cfg, tmp_path / "run", log=QUIET)
    return tmp_path / "run"


def test_deploy_train_folder_builds_int8_with_one_command(tmp_path, capsys):
    """`deploy train` keeps the same contract as the bridges: its sidecar lists the samples it wrote, with their
    sha256, so the one command calibrates and judges on them."""
    run = train_digits(tmp_path, device="cpu", threads=1)
    meta = json.loads((run / "model.meta.json").read_text())
    assert meta["deploy_data"] == {"calib": "model.calib.npz", "validate": "model.validate.npz"}
    out = tmp_path / "int8"
    assert _deploy("build", "--checkpoint", str(run), "--target", "cpu", "--precision", "int8", "--out", str(out)) == 0
    _check_bridge_build(out, run, "deploy train")
    (run / "model.calib.npz").write_bytes((run / "model.calib.npz").read_bytes() + b"\0")  # changed after training
    assert _deploy("build", "--checkpoint", str(run), "--target", "cpu", "--precision", "int8", "--out", str(out)) == 3
    assert "changed after" in capsys.readouterr().err
    assert json.loads((out / "report.json").read_text())["status"] == "passed"  # the good build kept
