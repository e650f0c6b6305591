"""A model that changes its input in place (``x.mul_(2)``) is compared on the feeds as generated: every run,
eager or exported, gets tensors of its own, so one run's write never reaches the next run's input."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.cli import main

IN_PLACE = textwrap.dedent(
    """
    from torch import nn


    class InPlace(nn.Module):
        def forward(self, x):
            x.mul_(2)  # scales its input in place
            return x + 1


    def build():
        return InPlace()
    """
)


def test_a_model_that_writes_its_input_builds_and_matches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime as ort

    name = f"inplace_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(IN_PLACE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    argv = ["build", "--factory", f"{name}:build", "--input", "x:batchx8", "--dim", "batch=1:2:4", "--output", "y",
            "--samples", "2", "--latency-iters", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    goldens = np.load(out / "goldens.npz")
    x, y = goldens["opt/0/in/x"], goldens["opt/0/out/y"]
    assert np.allclose(y, 2 * x + 1, atol=1e-6)  # the goldens' inputs are the ones the model was given
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert np.allclose(sess.run(None, {"x": x})[0], y, atol=1e-6)
