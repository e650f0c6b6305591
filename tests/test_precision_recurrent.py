"""INT8 for sequence models on cpu: a Conv1d + LSTM voice-activity-style model gets INT8 LSTM projections."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgedeploy.api import build
from edgedeploy.precision.analysis import int8_compute_ops

VAD = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Vad(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(20, 32, 3, padding=1)
            self.lstm = nn.LSTM(32, 48, batch_first=True)
            self.head = nn.Linear(48, 1)

        def forward(self, features):
            y, _ = self.lstm(torch.relu(self.conv(features)).transpose(1, 2))
            return torch.sigmoid(self.head(y))


    def build():
        return Vad()
    """
)


def _speechlike(n: int, frames: int, seed: int) -> np.ndarray:
    """Smooth band-energy tracks (a few drifting tones and pauses): structured sequences, not white noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames)[None, None, :]
    freq = rng.uniform(0.05, 0.3, (n, 20, 1))
    gate = (np.sin(t * rng.uniform(0.02, 0.1, (n, 1, 1)) + rng.uniform(0, 6, (n, 1, 1))) > -0.2).astype(np.float32)
    x = gate * np.sin(t * freq + rng.uniform(0, 6, (n, 20, 1))) + 0.05 * rng.standard_normal((n, 20, frames))
    return x.astype(np.float32)


def _project(folder: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    name = f"vad_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(VAD)
    ns: dict = {}
    exec(compile(VAD, "vad.py", "exec"), ns)  # the test's own model source
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in ns["build"]().state_dict().items()}, str(folder / "w.safetensors"))
    np.savez(folder / "calib.npz", features=_speechlike(32, 50, seed=1))
    (folder / "deploy.toml").write_text(
        textwrap.dedent(
            f"""
            outputs = ["speech"]
            [model]
            factory = "{name}:build"
            checkpoint = "w.safetensors"
            [[inputs]]
            name = "features"
            shape = ["batch", 20, "time"]
            range = [-1.2, 1.2]
            [dims.batch]
            min = 1
            opt = 2
            max = 4
            [dims.time]
            min = 16
            opt = 50
            max = 100
            [precision]
            mode = "int8"
            calib = "calib.npz"
            calib_samples = 32
            [export]
            exporter = "torchscript"
            [build]
            target = "cpu"
            out = "out"
            """
        )
    )
    return folder / "deploy.toml"


@pytest.mark.slow  # ~60 s: quantization, the LSTM route and judging at three sequence lengths
def test_conv1d_lstm_builds_int8_for_cpu_with_int8_lstm_projections(tmp_path: Path) -> None:
    result = build(_project(tmp_path / "proj"), log=lambda _: None)
    assert result.ok and result.report["status"] == "passed" and result.report["precision"] == "int8"
    plan = json.loads((result.out / "precision.json").read_text())
    recurrent = plan["recurrent_int8"]
    assert recurrent["kept"] and recurrent["lstm"] and recurrent["score"] >= plan["accuracy_target"]["value"]
    model = result.out / "model.int8.onnx"
    ops = [n.op_type for n in onnx.load(str(model)).graph.node]
    assert "DynamicQuantizeLSTM" in ops and "LSTM" not in ops
    assert any(op.startswith("DynamicQuantizeLSTM") for op in ops) and int8_compute_ops(model)
    cand = {c["name"]: c for c in result.report["parity"]["candidates"]}["onnxruntime-int8"]
    assert cand["status"] == "passed"
    assert any(r["shape"] in ("data", "calib-heldout") and r["agreement_judged"] for r in cand["checks"])
