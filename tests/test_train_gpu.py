"""The training stage on a CUDA GPU: a run stopped mid-epoch and resumed ends bit-identical to an uninterrupted
one in fp32, fp16 (with its GradScaler) and bf16; deterministic kernels make a net whose backward accumulates
with atomics give the same bits twice; ``run.deterministic = 'strict'`` names a CUDA op with no deterministic
kernel; a model compiled by inductor (Triton kernels) in channels_last memory resumes exactly; a checkpoint
trained there builds INT8 for cpu with one command.

Marked ``gpu`` and skipped where no CUDA device is visible (CI has none).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from test_train_export import train_digits
from test_train_resume import QUIET, _assert_identical, _cfg, _weights, straight_and_resumed

from edgedeploy.cli import main
from edgedeploy.errors import TargetCapabilityError
from edgedeploy.train.runner import run_training

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")]

# x[:, idx] with repeated indices: its backward accumulates into the same elements (index_put_ with
# accumulate), with float atomics in whatever order CUDA threads finish unless deterministic kernels are on
GATHER_NET = """
import torch
from torch import nn


class Gather(nn.Module):
    def __init__(self, num_classes=2):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.register_buffer("idx", torch.arange(4096) % 97)
        self.head = nn.Linear(4096, num_classes)

    def forward(self, x):
        h = self.conv(x).flatten(1)
        return self.head(torch.tanh(h[:, self.idx]))


def net(num_classes=2):
    return Gather(num_classes)
"""

# AdaptiveAvgPool2d's CUDA backward has no deterministic kernel in torch
POOLED_NET = """
import torch
from torch import nn


def net(num_classes=2):
    pool = nn.AdaptiveAvgPool2d(2)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), pool, nn.Flatten(), nn.Linear(16, num_classes))
"""


@pytest.mark.parametrize("precision", ["fp32", "auto", "bf16"])
def test_a_cuda_run_stopped_mid_epoch_and_resumed_is_bit_identical(tmp_path, precision):
    """Dropout draws from the CUDA generator, BatchNorm, cosine schedule with warm-up, EMA; ``auto`` is fp16
    with a GradScaler on CUDA, whose scale resumes too."""
    cfg = _cfg(tmp_path, schedule="cosine", warmup=3, precision=precision, ema=0.8, device="cuda")
    straight, resumed = straight_and_resumed(cfg, tmp_path)
    _assert_identical(_weights(straight), _weights(resumed))
    assert [h["train_loss"] for h in straight.state.history] == [h["train_loss"] for h in resumed.state.history]
    a = json.loads((tmp_path / "straight" / "model.resume.json").read_text())["train_state"]
    b = json.loads((tmp_path / "sliced" / "model.resume.json").read_text())["train_state"]
    assert a["amp"] == b["amp"]
    assert bool(a["amp"]["scaler"]) == (precision == "auto")  # fp16's GradScaler state, resumed
    assert "cuda" in a["rng"][0]  # the CUDA generator's state is saved (and restored) with the CPU one


def test_deterministic_kernels_give_the_same_bits_twice_for_a_backward_that_accumulates(tmp_path):
    cfg = _cfg(tmp_path, net=GATHER_NET, device="cuda", epochs=2)
    first = run_training(cfg, tmp_path / "first", log=QUIET)
    second = run_training(cfg, tmp_path / "second", log=QUIET)
    _assert_identical(_weights(first), _weights(second))
    assert not torch.are_deterministic_algorithms_enabled()  # the process's setting is given back


def test_strict_determinism_names_the_cuda_op_that_has_no_deterministic_kernel(tmp_path):
    cfg = _cfg(tmp_path, net=POOLED_NET, device="cuda", deterministic="strict")
    with pytest.raises(TargetCapabilityError, match="adaptive_avg_pool2d_backward_cuda") as err:
        run_training(cfg, tmp_path / "run", log=QUIET)
    assert "run.deterministic = 'auto'" in err.value.hint
    assert not (tmp_path / "run" / "model.safetensors").exists()
    with pytest.warns(UserWarning, match="adaptive_avg_pool2d_backward_cuda"):  # auto runs it and says so
        run_training(_cfg(tmp_path, net=POOLED_NET, device="cuda"), tmp_path / "auto", log=QUIET)


def test_a_checkpoint_trained_on_cuda_builds_int8_for_cpu_with_one_command(tmp_path, capsys):
    run = train_digits(tmp_path, device="cuda", precision="auto")
    out = tmp_path / "int8"
    argv = ["build", "--checkpoint", str(run), "--target", "cpu", "--precision", "int8", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    assert json.loads((out / "report.json").read_text())["status"] == "passed"


def test_an_inductor_compiled_channels_last_cuda_run_resumes_exactly_and_its_checkpoint_builds(
    tmp_path, capsys, monkeypatch
):
    cfg = _cfg(tmp_path, schedule="cosine", precision="auto", device="cuda")
    cfg = dataclasses.replace(
        cfg,
        run=dataclasses.replace(cfg.run, compile=True, channels_last=True),
        data=dataclasses.replace(cfg.data, pin_memory=True),
    )
    straight, resumed = straight_and_resumed(cfg, tmp_path)
    assert straight.metrics["compiled"] is True and resumed.metrics["compiled"] is True  # no eager fallback
    _assert_identical(_weights(straight), _weights(resumed))
    assert not any(k.startswith("_orig_mod") for k in _weights(straight))  # the plain module's names
    monkeypatch.chdir(tmp_path)  # the factory named on the command line, found in the project folder
    argv = ["build", "--checkpoint", "straight", "--factory", "dropnet:net", "--target", "cpu", "--out", "cpu"]
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
