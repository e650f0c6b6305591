"""hf_text + the BERT + BiLSTM + attention classifier: real text bundled with scikit-learn, an offline
WordPiece tokenizer, int64 ids + mask in the sidecar, and a checkpoint the deploy side loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("transformers")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "text"


def _text_project(tmp_path, vocab: int = 300):
    from edgedeploy.train.text import build_wordpiece_tokenizer, sklearn_descr_corpus, write_csv

    rows = sklearn_descr_corpus(words_per_sample=8)
    write_csv(rows, tmp_path / "corpus.csv")
    build_wordpiece_tokenizer([t for t, _ in rows], tmp_path / "tok", vocab_size=vocab)
    return rows


def test_bert_bilstm_trains_on_real_text_and_its_checkpoint_loads_on_the_deploy_side(tmp_path):
    from edgedeploy.config import config_from_dict
    from edgedeploy.errors import ConfigError
    from edgedeploy.modelio.checkpoint import load_model
    from edgedeploy.train.config import train_config_from_dict
    from edgedeploy.train.models import bert_bilstm_classifier
    from edgedeploy.train.runner import run_training

    rows = _text_project(tmp_path)
    assert len(rows) > 200 and len({label for _, label in rows}) == 6
    kwargs = {"vocab_size": 300, "num_classes": 6, "tiny": True, "max_length": 16, "dropout": 0.0}
    raw = {
        "model": {"factory": "edgedeploy.train.models:bert_bilstm_classifier", "kwargs": kwargs},
        "data": {"dataset": "hf_text", "path": "corpus.csv", "tokenizer": "tok", "max_length": 16, "batch_size": 32},
        "optim": {"lr": 3e-3},
        "monitor": {"memory": False},
        "run": {"epochs": 2, "device": "cpu", "threads": 1, "freeze": ["bert.embeddings"]},
        "deploy": {"batch": [1, 4, 64]},
    }
    small = {**raw, "model": {**raw["model"], "kwargs": {**kwargs, "vocab_size": 100}}}
    with pytest.raises(ConfigError, match=r"'model.kwargs.vocab_size' = 100 is smaller than the tokenizer's 300"):
        run_training(train_config_from_dict(small, source="train.toml", base_dir=tmp_path), tmp_path / "x")
    cfg = train_config_from_dict(raw, source="train.toml", base_dir=tmp_path)
    result = run_training(cfg, tmp_path / "ckpt", log=lambda _l: None)
    assert result.state.history[-1]["train_loss"] < result.state.history[0]["train_loss"]
    meta = json.loads(result.checkpoint.with_suffix(".meta.json").read_text())
    assert meta["inputs"] == [
        {"name": "input_ids", "shape": ["batch", 16], "dtype": "int64", "range": [0, 299]},
        {"name": "attention_mask", "shape": ["batch", 16], "dtype": "int64", "range": [0, 1]},
    ]
    assert meta["class_names"] == sorted({label for _, label in rows})
    torch.manual_seed(0)  # the runner seeds with run.seed before building: this is the initial model
    init = bert_bilstm_classifier(**kwargs).state_dict()
    trained = load_file(str(result.checkpoint))
    emb = "bert.embeddings.word_embeddings.weight"
    assert torch.equal(trained[emb], init[emb])  # frozen
    assert not torch.equal(trained["head.weight"], init["head.weight"])
    calib = np.load(tmp_path / "ckpt" / "model.calib.npz")
    held = np.load(tmp_path / "ckpt" / "model.validate.npz")
    assert calib["input_ids"].dtype == np.int64 and held["attention_mask"].shape[1] == 16
    # deploy side: the zoo factory from the sidecar, int64 feeds, and the mask really masks padding
    deploy = config_from_dict({"model": {"checkpoint": str(result.checkpoint)}, "build": {"target": "cpu"}})
    assert deploy.factory_origin == "package" and [s.dtype for s in deploy.inputs] == ["int64", "int64"]
    model = load_model(deploy, result.checkpoint)
    ids, mask = torch.from_numpy(held["input_ids"][:8]), torch.from_numpy(held["attention_mask"][:8]).clone()
    mask[:, 10:] = 0  # treat the tail as padding
    noisy = torch.where(mask == 0, torch.randint_like(ids, 5, 299), ids)  # change only padded positions
    with torch.no_grad():
        assert torch.allclose(model(ids, mask), model(noisy, mask), atol=1e-5)
        assert not torch.allclose(model(ids, mask), model(ids, torch.ones_like(mask)), atol=1e-4)


@pytest.mark.slow
def test_text_example_trains_and_builds_int8_for_cpu(tmp_path):
    import subprocess
    import sys

    import edgedeploy
    from edgedeploy.cli import main

    subprocess.run([sys.executable, str(EXAMPLE / "prepare.py"), str(tmp_path / "data")], check=True)
    cfg_text = (EXAMPLE / "train.toml").read_text()
    (tmp_path / "train.toml").write_text(cfg_text)
    out = tmp_path / "checkpoint"
    assert main(["train", "--config", str(tmp_path / "train.toml"), "--out", str(out)]) == 0
    meta = json.loads((out / "model.meta.json").read_text())
    assert meta["metrics"]["test_accuracy"] >= 0.45, meta["metrics"]  # 6 classes, majority class 0.28
    result = edgedeploy.build(
        EXAMPLE / "deploy.toml",
        model__checkpoint=str(out / "model.safetensors"),
        precision__calib=str(out / "model.calib.npz"),
        validate__data=str(out / "model.validate.npz"),
        build__out=str(tmp_path / "cpu"),
        log=lambda _line: None,
    )
    assert result.ok and result.report["status"] == "passed" and result.report["precision"] == "int8"
