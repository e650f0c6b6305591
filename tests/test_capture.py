"""Capture stage: trace / script / torch.export, checked against eager at every dynamic dim's min / max."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from edgedeploy.artifacts import EXPORTED_PROGRAM, TORCHSCRIPT
from edgedeploy.config import DeployConfig, config_from_dict
from edgedeploy.errors import StageError
from edgedeploy.pipeline.runner import run_build
from edgedeploy.stages.capture import TorchScriptFromModel

GOOD_MODEL = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.fc(y.view(x.shape[0], 4, -1).mean(-1))


def build():
    torch.manual_seed(0)
    return Net()
"""

# int(x.size(0)) freezes the example's batch size into the traced graph
BAKED_MODEL = """
import torch
from torch import nn


class Baked(nn.Module):
    def forward(self, x):
        n = int(x.size(0))
        return x.reshape(n, -1).sum(-1)


def build():
    return Baked()
"""
BAKED_LINE = next(i for i, line in enumerate(BAKED_MODEL.splitlines(), 1) if "int(x.size(0))" in line)


def make_config(
    folder: Path,
    source: str,
    *,
    inputs: list[dict[str, Any]] | None = None,
    dims: dict[str, dict[str, int]] | None = None,
    outputs: tuple[str, ...] = ("y",),
    **sections: dict[str, Any],
) -> DeployConfig:
    """A config for ``source`` (written as a uniquely named module in ``folder``), cpu target, tiny shapes."""
    folder.mkdir(parents=True, exist_ok=True)
    module = f"m_{uuid.uuid4().hex[:10]}"
    (folder / f"{module}.py").write_text(textwrap.dedent(source))
    raw: dict[str, Any] = {
        "model": {"factory": f"{module}:build"},
        "inputs": inputs or [{"name": "x", "shape": ["batch", 3, 4, 4], "range": [-1.0, 1.0]}],
        "dims": dims or {"batch": {"min": 1, "opt": 2, "max": 4}},
        "outputs": list(outputs),
        "validate": {"samples": 1, "latency_iters": 1, "latency_warmup": 0},
        "build": {"out": str(folder / "out"), "cache": False},
    }
    for key, value in sections.items():
        raw.setdefault(key, {}).update(value)
    return config_from_dict(raw, source=str(folder / "deploy.toml"), base_dir=folder)


def quiet(_line: str) -> None:
    """Progress sink for builds run inside tests."""


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
@pytest.mark.parametrize("mode", ["trace", "script"])
def test_torchscript_capture_is_saved_and_matches_eager_at_every_dim(tmp_path: Path, mode: str) -> None:
    import torch

    cfg = make_config(tmp_path, GOOD_MODEL, export={"capture": mode})
    result = run_build(cfg, stages=[TorchScriptFromModel()], log=quiet)
    metrics = result.report["metrics"]["capture"]
    assert set(metrics["points"]) >= {"opt", "batch=1 (min)", "batch=4 (max)"}
    assert all(p["ok"] for p in metrics["points"].values())
    assert metrics["max_abs_vs_eager"] <= 1e-4
    loaded = torch.jit.load(str(result.out / TORCHSCRIPT))
    assert tuple(loaded(torch.zeros(3, 3, 4, 4)).shape) == (3, 5)


def test_export_capture_saves_exported_program(tmp_path: Path) -> None:
    import torch

    cfg = make_config(tmp_path, GOOD_MODEL, export={"capture": "export"})
    stage = TorchScriptFromModel()
    result = run_build(cfg, stages=[stage], log=quiet)
    assert result.stages[0].files == [EXPORTED_PROGRAM]
    assert not (result.out / TORCHSCRIPT).exists()
    program = torch.export.load(str(result.out / EXPORTED_PROGRAM))
    assert tuple(program.module()(torch.zeros(3, 3, 4, 4)).shape) == (3, 5)


def test_tracer_warning_fails_at_the_users_line(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, BAKED_MODEL, export={"capture": "trace"})
    with pytest.raises(StageError) as err:
        run_build(cfg, stages=[TorchScriptFromModel()], log=quiet)
    text = err.value.one_line()
    module_file = next(tmp_path.glob("m_*.py"))
    assert f"{module_file}:{BAKED_LINE}" in text
    assert "TracerWarning" in text
    assert "torch/" not in text.split("TracerWarning")[1].split(":")[0]


def test_trace_check_names_the_baked_dim_when_warnings_are_allowed(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, BAKED_MODEL, export={"capture": "trace", "fail_on_tracer_warnings": False})
    with pytest.raises(StageError) as err:
        run_build(cfg, stages=[TorchScriptFromModel()], log=quiet)
    assert "batch=1 (min)" in err.value.message
    assert "shape" in err.value.message


def test_torch_export_capture_names_the_specialised_dim(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, BAKED_MODEL, export={"capture": "export"})
    with pytest.raises(StageError) as err:
        run_build(cfg, stages=[TorchScriptFromModel()], log=quiet)
    assert "torch.export.export failed" in err.value.message
    assert "batch" in err.value.message
    assert err.value.exit_code == 6


def test_auto_capture_records_why_trace_and_export_failed_and_keeps_script(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, BAKED_MODEL)
    assert cfg.export.capture == "auto"
    result = run_build(cfg, stages=[TorchScriptFromModel()], log=quiet)
    metrics = result.report["metrics"]["capture"]
    assert metrics["route"] == "script"
    assert [t["route"] for t in metrics["tried"]] == ["trace", "export"]
    module_file = next(tmp_path.glob("m_*.py"))
    assert f"{module_file}:{BAKED_LINE}" in metrics["tried"][0]["reason"]
    assert "batch" in metrics["tried"][1]["reason"]
    assert result.stages[0].files == [TORCHSCRIPT]


LSTM_MODEL = """
import torch
from torch import nn


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out)


def build():
    torch.manual_seed(0)
    return Tagger()
"""
LSTM_LINE = next(i for i, line in enumerate(LSTM_MODEL.splitlines(), 1) if "self.lstm(x)" in line)


def test_tracer_warnings_inside_library_code_are_not_blamed_on_the_user(tmp_path: Path) -> None:
    """nn.LSTM's TracerWarnings are library findings: the trace is judged by the shape probes instead."""
    cfg = make_config(
        tmp_path,
        LSTM_MODEL,
        inputs=[{"name": "x", "shape": ["batch", "time", 8], "range": [-1.0, 1.0]}],
        dims={"batch": {"min": 1, "opt": 2, "max": 3}, "time": {"min": 1, "opt": 6, "max": 12}},
        export={"capture": "trace"},
    )
    result = run_build(cfg, stages=[TorchScriptFromModel()], log=quiet)
    metrics = result.report["metrics"]["capture"]
    assert metrics["route"] == "trace"
    assert metrics["tracer_warnings_library"] >= 1
    assert metrics["tracer_warnings_library"] == len(metrics["tracer_warnings"])
    warning = metrics["tracer_warnings"][0]
    module_file = next(tmp_path.glob("m_*.py"))
    assert "torch/nn/modules/rnn.py" in warning
    assert f"called from {module_file}:{LSTM_LINE}" in warning
    assert set(metrics["points"]) >= {"time=1 (min)", "time=12 (max)"}


def test_a_device_target_traces_only_to_prove_the_cheaper_exporter_and_never_fails_on_it(tmp_path: Path) -> None:
    """A TensorRT target's bundle carries only ONNX and validation runs on the device: the capture's one use
    here is to prove tracing safe so export = auto may take the TorchScript exporter."""
    cfg = make_config(tmp_path, GOOD_MODEL, build={"target": "jetson-orin"})
    result = run_build(cfg, stages=[TorchScriptFromModel()], log=quiet)
    assert result.stages[0].status == "ran" and result.report["metrics"]["capture"]["route"] == "trace"
    # a model tracing freezes: recorded, not an error (a cpu build fails it); export keeps dynamo first
    baked = make_config(tmp_path / "b", BAKED_MODEL, build={"target": "jetson-orin"})
    result = run_build(baked, stages=[TorchScriptFromModel()], log=quiet)
    metrics = result.report["metrics"]["capture"]
    assert result.stages[0].status == "ran" and metrics["route"] is None and result.stages[0].files == []
    assert [t["route"] for t in metrics["tried"]] == ["trace"]  # torch.export and script: nothing here uses them
    from edgedeploy.onnxtools.export import cheapest_first

    assert cheapest_first(["dynamo", "torchscript"], metrics)[0] == ["dynamo", "torchscript"]
    pinned = make_config(tmp_path / "p", GOOD_MODEL, build={"target": "jetson-orin"}, export={"exporter": "dynamo"})
    skipped = run_build(pinned, stages=[TorchScriptFromModel()], log=quiet).stages[0]
    assert skipped.status == "skipped" and "nothing here consumes" in skipped.reason
    explicit = make_config(tmp_path / "e", GOOD_MODEL, build={"target": "jetson-orin"}, export={"capture": "trace"})
    assert run_build(explicit, stages=[TorchScriptFromModel()], log=quiet).stages[0].status == "ran"


# frames of 4 samples: a length that is not a multiple of 4 fails inside the user's forward
FRAMED_MODEL = """
import torch
from torch import nn


class Framed(nn.Module):
    def forward(self, x):
        return x.reshape(x.shape[0], -1, 4).mean(-1)


def build():
    return Framed()
"""


def test_model_failing_at_a_declared_size_is_one_named_error(tmp_path: Path) -> None:
    # time 4..16: min, opt and max are multiples of 4, the probe's random size in between is not (seeded)
    cfg = make_config(
        tmp_path,
        FRAMED_MODEL,
        inputs=[{"name": "x", "shape": [1, "time"], "range": [-1.0, 1.0]}],
        dims={"time": {"min": 4, "opt": 8, "max": 16}},
    )
    with pytest.raises(StageError) as err:
        run_build(cfg, stages=[TorchScriptFromModel()], log=quiet)
    text = err.value.one_line()
    assert "the PyTorch model fails at probe point time=" in text and "(random)" in text
    assert "x [1, " in text and "invalid for input of size" in text  # the point's shape and torch's own reason
    assert "[dims.time]" in err.value.hint and "pad inside forward" in err.value.hint


def test_reference_outputs_failing_at_a_declared_shape_is_one_named_error(tmp_path: Path) -> None:
    from edgedeploy.stages.reference import GoldensFromTorch

    cfg = make_config(
        tmp_path,
        FRAMED_MODEL,
        inputs=[{"name": "x", "shape": [1, "time"], "range": [-1.0, 1.0]}],
        dims={"time": {"min": 4, "opt": 8, "max": 18}},  # max 18 is not a whole number of frames
    )
    with pytest.raises(StageError) as err:
        run_build(cfg, stages=[GoldensFromTorch()], log=quiet)
    text = err.value.one_line()
    assert "the PyTorch model fails on the max goldens (inputs x [1, 18])" in text and "[dims]" in err.value.hint
