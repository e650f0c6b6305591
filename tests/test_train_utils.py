"""LR range test, checkpoint parameter diff, peak memory, profiler trace and anomaly detection."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from edgedeploy.errors import CheckpointError, ConfigError
from edgedeploy.train.lr_finder import lr_range_test
from edgedeploy.train.utils import PeakMemory, anomaly_detection, param_diff, step_profiler


def _regression_batches(n: int = 8):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 1, generator=g)
    batches = []
    for _ in range(n):
        x = torch.randn(32, 8, generator=g)
        batches.append((x, x @ w))
    return batches


def test_lr_range_test_suggests_a_working_lr_restores_state_and_plots(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = lr_range_test(model, _regression_batches(), opt, nn.functional.mse_loss, start_lr=1e-5, end_lr=10.0)
    assert len(result.lrs) == len(result.losses) >= 10
    assert result.lrs == sorted(result.lrs)
    assert len(result.lrs) < 100  # stopped when the loss diverged at large lrs
    assert 1e-3 <= result.suggested_lr <= 1.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # model restored
    assert opt.param_groups[0]["lr"] == 0.01  # optimizer restored
    # the suggestion actually trains: 30 plain SGD steps at it cut the loss by 10x
    opt = torch.optim.SGD(model.parameters(), lr=result.suggested_lr)
    x, y = _regression_batches(1)[0]
    start = nn.functional.mse_loss(model(x), y).item()
    for _ in range(30):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    assert nn.functional.mse_loss(model(x), y).item() < start / 10
    png = result.plot(tmp_path / "lr.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ConfigError):
        lr_range_test(model, _regression_batches(), opt, nn.functional.mse_loss, start_lr=1.0, end_lr=0.1)


def test_param_diff_between_two_checkpoints(tmp_path):
    a = {"w": torch.zeros(2, 2), "b": torch.ones(2), "only_a": torch.zeros(1), "shape": torch.zeros(3)}
    b = {
        "w": torch.tensor([[0.0, 0.5], [0.0, -1.0]]),
        "b": torch.ones(2),
        "only_b": torch.zeros(1),
        "shape": torch.zeros(4),
    }
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    diff = param_diff(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert diff.changes["w"] == {"mean_abs": pytest.approx(0.375), "max_abs": 1.0}
    assert diff.changes["b"]["max_abs"] == 0.0
    assert diff.changed() == ["w"] and diff.changed(atol=1.0) == []
    assert diff.only_in_a == ["only_a"] and diff.only_in_b == ["only_b"]
    assert diff.shape_mismatch == {"shape": ((3,), (4,))}
    assert not diff.identical and param_diff(a, dict(a)).identical
    with pytest.raises(CheckpointError):
        param_diff(tmp_path / "missing.safetensors", a)


def test_peak_memory_sees_a_large_cpu_allocation():
    with PeakMemory("cpu") as small:
        torch.ones(16)
    with PeakMemory("cpu") as big:
        t = torch.ones(64 * 2**20 // 4)  # 64 MiB, pages touched
        t.add_(1)
    assert big.kind == "rss"
    assert big.delta_bytes > 48 * 2**20 > small.delta_bytes
    assert "MiB" in big.summary()
    del t


def test_profiler_writes_a_chrome_trace(tmp_path):
    model = nn.Linear(16, 16)
    with step_profiler(tmp_path, wait=0, warmup=1, active=2) as prof:
        for _ in range(4):
            model(torch.randn(4, 16)).sum().backward()
            prof.step()
    traces = list(tmp_path.glob("trace_step*.json"))
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any("addmm" in str(e.get("name", "")) for e in events)


@pytest.mark.filterwarnings("ignore::UserWarning")  # anomaly mode prints the forward traceback
def test_anomaly_detection_toggle_names_the_nan_and_restores_setting():
    def nan_backward():
        x = torch.tensor([-1.0], requires_grad=True)
        torch.sqrt(x).sum().backward()

    assert not torch.is_anomaly_enabled()
    nan_backward()  # silently NaN without anomaly detection
    with anomaly_detection():
        assert torch.is_anomaly_enabled()
        with pytest.raises(RuntimeError, match="SqrtBackward0"):
            nan_backward()
    assert not torch.is_anomaly_enabled()


def test_model_diff_takes_two_models_as_the_notes_call_it():
    from edgedeploy.train.models import digits_cnn
    from edgedeploy.train.utils import model_diff

    torch.manual_seed(0)
    model = digits_cnn(channels=4, num_classes=3)
    same = model_diff(model, model)
    assert set(same) == {n for n, _ in model.named_parameters()} and not any(same.values())
    other = digits_cnn(channels=4, num_classes=3)
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        other.head.weight.add_(0.5)
    changed = model_diff(model, other)
    assert changed["head.weight"] == pytest.approx(0.5) and changed["head.bias"] == 0.0
    assert param_diff(model, other).changed() == ["head.weight"]
    with pytest.raises(ValueError, match="structure"):
        model_diff(model, digits_cnn(channels=8, num_classes=3))
