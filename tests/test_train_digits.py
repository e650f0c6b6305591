"""The digits example end to end: deploy train to >= 97% held-out accuracy, then deploy build with parity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import edgedeploy
from edgedeploy.cli import main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits"


@pytest.mark.slow
def test_digits_example_trains_to_97_percent_and_its_checkpoint_builds_with_parity(tmp_path, capsys):
    out = tmp_path / "checkpoint"
    assert main(["train", "--config", str(EXAMPLE / "train.toml"), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "TRAINED: 12 epochs" in printed.out
    assert "epoch 12/12" in printed.err and "samples/s" in printed.err  # progress lines
    meta = json.loads((out / "model.meta.json").read_text())
    assert meta["metrics"]["test_accuracy"] >= 0.97, meta["metrics"]
    assert meta["metrics"]["skipped_steps"] == 0
    # the example's deploy.toml names only the checkpoint: the sidecar supplies the rest
    result = edgedeploy.build(
        EXAMPLE / "deploy.toml",
        model__checkpoint=str(out / "model.safetensors"),
        build__out=str(tmp_path / "cpu"),
        log=lambda _line: None,
    )
    assert result.ok and result.target == "cpu"
    assert result.report["status"] == "passed"
    assert (tmp_path / "cpu" / "model.onnx").is_file() or any(n.endswith(".onnx") for n in result.artifacts)
