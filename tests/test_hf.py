"""Hugging Face model folders as a model source: spec from config.json, tokenizer-driven data, builds."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgedeploy
from edgedeploy.config import config_from_dict
from edgedeploy.errors import ConfigError, InputError

transformers = pytest.importorskip("transformers")

from hf_tiny import ARCHS, SENTENCES, save_tiny  # noqa: E402

# one xdist worker runs this module, so its module-scoped build fixture runs once (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_hf")


def quiet(_line: str) -> None:
    """Progress sink for builds run inside tests."""


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny("bert", tmp_path_factory.mktemp("hf") / "bert")


def _raw(folder: Path, out: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "model": {"hf": str(folder)},
        "validate": {"samples": 1, "latency_iters": 1, "latency_warmup": 0},
        "build": {"out": str(out), "cache": False},
    }
    for key, value in sections.items():
        raw.setdefault(key, {}).update(value)
    return raw


def test_config_json_brings_inputs_dims_outputs(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 100, "type_vocab_size": 2}))
    (folder / "model.safetensors").write_bytes(b"")
    cfg = config_from_dict({"model": {"hf": "m"}}, source="deploy.toml", base_dir=tmp_path)
    assert [s.name for s in cfg.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [s.kind for s in cfg.inputs] == ["ids", "mask", "ids"]
    assert cfg.inputs[0].range == (0, 99) and cfg.inputs[2].range == (0, 1)
    assert all(s.shape == ("batch", "sequence") for s in cfg.inputs)
    assert cfg.outputs == ("embedding",)
    assert cfg.model.factory == "edgedeploy.modelio.hf:from_folder"
    vision = tmp_path / "v"
    vision.mkdir()
    (vision / "config.json").write_text(json.dumps({"model_type": "vit", "image_size": 32, "num_channels": 3}))
    (vision / "model.safetensors").write_bytes(b"")
    cfg = config_from_dict(
        {"model": {"hf": "v", "task": "image-classification"}}, source="deploy.toml", base_dir=tmp_path
    )
    assert [(s.name, s.shape, s.kind) for s in cfg.inputs] == [("pixel_values", ("batch", 3, 32, 32), "image")]
    assert cfg.outputs == ("logits",)


def test_bad_hf_folder_and_task_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="folder not found"):
        config_from_dict({"model": {"hf": "nope"}}, source="deploy.toml", base_dir=tmp_path)
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        config_from_dict({"model": {"hf": "m"}}, source="deploy.toml", base_dir=tmp_path)
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 10}))
    (tmp_path / "m" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="model.task"):
        config_from_dict({"model": {"hf": "m", "task": "translation"}}, source="deploy.toml", base_dir=tmp_path)


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"vocab_size": "abc"}, "'vocab_size' = 'abc'"),
        ({"vocab_size": [5]}, "'vocab_size' = [5]"),
        ({"vocab_size": 10, "type_vocab_size": {"a": 1}}, "'type_vocab_size' = {'a': 1}"),
        ({"vocab_size": 10, "max_position_embeddings": 1.5}, "'max_position_embeddings' = 1.5"),
    ],
)
def test_a_config_json_value_of_the_wrong_type_is_one_config_error(tmp_path: Path, config, named) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "bert", **config}))
    (tmp_path / "m" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match=re.escape(f"config.json: key {named} must be a whole number")):
        config_from_dict({"model": {"hf": "m"}}, source="deploy.toml", base_dir=tmp_path)


def test_a_tokenizer_config_that_is_no_regular_file_is_one_line_not_a_hang(tmp_path: Path) -> None:
    import os

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 10}))
    (tmp_path / "m" / "model.safetensors").write_bytes(b"")
    os.mkfifo(tmp_path / "m" / "tokenizer_config.json")  # a plain read blocks until someone writes
    with pytest.raises(ConfigError, match=r"tokenizer_config.json: unreadable \(.*not a regular file"):
        config_from_dict({"model": {"hf": "m"}}, source="deploy.toml", base_dir=tmp_path)
    (tmp_path / "m" / "tokenizer_config.json").unlink()
    (tmp_path / "m" / "tokenizer_config.json").symlink_to("/dev/zero")  # reads for ever
    with pytest.raises(ConfigError, match="not a regular file"):
        config_from_dict({"model": {"hf": "m"}}, source="deploy.toml", base_dir=tmp_path)


def test_text_file_is_tokenized_to_the_input_spec(bert_folder: Path, tmp_path: Path) -> None:
    from edgedeploy.modelio.hf import text_batches

    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(SENTENCES) + "\n\n")
    cfg = config_from_dict(_raw(bert_folder, tmp_path / "out"), source="t", base_dir=tmp_path)
    batches = text_batches(cfg, text)
    assert sum(b["input_ids"].shape[0] for b in batches) == len(SENTENCES)
    assert all(b["input_ids"].shape[0] <= cfg.dims["batch"].max for b in batches)
    for b in batches:
        mask = b["attention_mask"]
        assert mask.min() == 0 or mask.all()
        # prefix masks: each row is ones then zeros, and never all zeros
        assert all(row.sum() >= 1 and (row[: row.sum()] == 1).all() for row in mask)
        assert b["input_ids"][0, 0] == 2  # [CLS]


@pytest.mark.slow  # a full BERT FP32 build (~16 s); the INT8 sentences build keeps BERT in the fast run
def test_bert_embedder_with_output_named_embedding_builds_for_cpu(bert_folder: Path, tmp_path: Path) -> None:
    """No capture or exporter override; 'embedding' may collide with an internal tensor name."""
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(SENTENCES))
    raw = _raw(bert_folder, tmp_path / "out", validate={"data": str(text)})
    raw["outputs"] = ["embedding"]
    cfg = config_from_dict(raw, source="t", base_dir=tmp_path)
    assert cfg.export.capture == "auto" and cfg.export.exporter == "auto"
    result = edgedeploy.build(cfg, log=quiet)
    assert result.ok
    import onnx

    model = onnx.load(str(result.out / "model.onnx"))
    assert [o.name for o in model.graph.output] == ["embedding"]
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param  # batch stays symbolic
    goldens = np.load(result.out / "goldens.npz")
    real = [k for k in goldens.files if k.startswith("data/") and k.endswith("/out/embedding")]
    assert real, "validation sentences are in the goldens"
    emb = goldens[real[0]]
    assert emb.shape == (cfg.dims["batch"].max, 32) and np.ptp(emb) > 0


def test_int8_from_sentences_file_builds_for_cpu(bert_folder: Path, tmp_path: Path) -> None:
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(SENTENCES * 4))
    # the TorchScript exporter: this test is about the calibration text, and a dynamo export of BERT costs ~10 s
    raw = _raw(
        bert_folder,
        tmp_path / "out",
        precision={"mode": "int8", "calib": str(text)},
        export={"exporter": "torchscript"},
    )
    cfg = config_from_dict(raw, source="t", base_dir=tmp_path)
    result = edgedeploy.build(cfg, log=quiet)
    assert (result.out / "model.int8.onnx").is_file()
    assert result.report["metrics"]["precision"]
    goldens = np.load(result.out / "goldens.npz")
    # the held-out calibration sentences, as their own point (no validate.data here: nothing under data/)
    assert any(k.startswith("calib-heldout/") for k in goldens.files), "calibration sentences are in the goldens"
    assert not any(k.startswith("data/") for k in goldens.files)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_architecture_builds_with_defaults(arch: str, tmp_path: Path) -> None:
    folder = save_tiny(arch, tmp_path / arch)
    cfg = config_from_dict(_raw(folder, tmp_path / "out"), source=arch, base_dir=tmp_path)
    result = edgedeploy.build(cfg, log=quiet)
    assert result.ok
    assert result.report["metrics"]["capture"]["route"] in ("trace", "export", "script")


def test_missing_tokenizer_is_an_input_error(tmp_path: Path) -> None:
    folder = save_tiny("bert", tmp_path / "bert")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer_config.json").unlink()
    text = tmp_path / "s.txt"
    text.write_text("the cat\n")
    cfg = config_from_dict(_raw(folder, tmp_path / "out"), source="t", base_dir=tmp_path)
    from edgedeploy.modelio.hf import text_batches

    with pytest.raises(InputError, match="tokenizer"):
        text_batches(cfg, text)


def test_flags_alone_make_a_config_with_hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgedeploy.cli import build_parser
    from edgedeploy.commands._common import config_from_args

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "roberta", "vocab_size": 50}))
    (folder / "model.safetensors").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["build", "--hf", "m", "--task", "sequence-classification"])
    cfg = config_from_args(args)
    assert cfg.model.task == "sequence-classification" and cfg.outputs == ("logits",)
    assert [s.name for s in cfg.inputs] == ["input_ids", "attention_mask"]  # RoBERTa: no segment ids
    with pytest.raises(ConfigError, match="--config"):
        config_from_args(build_parser().parse_args(["build", "--target", "cpu"]))


def test_natural_minilm_class_int8_config_builds_and_every_verdict_agrees(tmp_path: Path) -> None:
    """A sentence embedder's config as a user writes it: the model folder (two int64 inputs, dynamic batch and
    sequence), tokenized calibration text, INT8 on cpu, no [validate] section. Precision, validation and the
    report judge the same real-sample evidence."""
    folder = save_tiny("distilbert", tmp_path / "distilbert")
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(SENTENCES * 4))
    raw = {
        "model": {"hf": str(folder)},
        "precision": {"mode": "int8", "calib": str(text)},
        "export": {"exporter": "torchscript"},  # the export route is not what this test is about
        "build": {"out": str(tmp_path / "out"), "cache": False, "target": "cpu"},
    }
    cfg = config_from_dict(raw, source="t", base_dir=tmp_path)
    assert [(s.name, s.dtype) for s in cfg.inputs] == [("input_ids", "int64"), ("attention_mask", "int64")]
    assert cfg.inputs[1].range == (0, 1) and all(isinstance(d, str) for d in cfg.inputs[0].shape)
    result = edgedeploy.build(cfg, log=quiet)
    assert result.ok and result.report["status"] == "passed" and result.report["precision"] == "int8"
    plan = json.loads((result.out / "precision.json").read_text())
    assert plan["strategy"].startswith("transformer") and plan["accuracy"]["score"] >= 0.99
    cand = {c["name"]: c for c in result.report["parity"]["candidates"]}["onnxruntime-int8"]
    assert cand["status"] == "passed"
    rows = [r for r in cand["checks"] if r["check"] == "parity"]
    real = [r for r in rows if r["shape"] in ("data", "calib-heldout")]
    assert real and all(r["agreement_judged"] and r["passed"] for r in real)  # real text judges agreement
    assert all(not r["agreement_judged"] for r in rows if r["shape"] in ("min", "opt", "max"))
    assert "speedup_vs_fp32" in result.report["metrics"]["precision"]
