"""A model whose eager outputs move between two runs on the same input (randomness or a buffer updated in
``forward``) fails in one line saying so, not with every capture route's and exporter's mismatch."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest

from edgedeploy.cli import main

NOISY = textwrap.dedent(
    """
    import torch.nn.functional as F
    from torch import nn


    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(F.dropout(x, 0.5, training=True))


    def build():
        return Noisy()
    """
)
COUNTING = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(1))

        def forward(self, x):
            self.calls += 1
            return x * self.calls


    def build():
        return Counting()
    """
)


@pytest.mark.parametrize(
    ("source", "target", "stage"), [(NOISY, "cpu", "capture"), (COUNTING, "jetson-orin", "export")]
)
def test_a_model_whose_eager_outputs_move_fails_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], source: str, target: str,
    stage: str,
) -> None:  # fmt: skip
    name = f"moving_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["build", "--factory", f"{name}:build", "--input", "x:batchx8", "--dim", "batch=1:2:4", "--output", "y",
            "--samples", "1", "--latency-iters", "1", "--out", str(tmp_path / "out"), "--target", target]  # fmt: skip
    assert main(argv) == 6
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("deploy: ")]
    assert len(err) == 1
    assert f"[{stage}] eager PyTorch is not deterministic: output 'y' differs by" in err[0]
    assert "between two runs on the same input -- fix: make forward() give the same output" in err[0]


def test_the_dry_run_feeds_masks_with_a_token_in_every_row() -> None:
    """The admission run draws inputs as every stage does: a model that refuses a fully masked row (as
    nn.TransformerEncoder's fast path does) is not refused for a row no stage would feed it."""
    import torch

    from edgedeploy.config import config_from_dict
    from edgedeploy.modelio.admission import dry_forward

    class NeedsAToken(torch.nn.Module):
        def forward(self, x, mask):
            if bool((mask.sum(1) == 0).any()):
                raise ValueError("every row needs at least one token")
            return x.sum(1)

    raw = {
        "model": {"factory": "m:build"},
        "outputs": ["y"],
        "inputs": [
            {"name": "x", "shape": ["batch", "seq", 4]},
            {"name": "mask", "shape": ["batch", "seq"], "dtype": "int64", "kind": "mask", "range": [0, 1]},
        ],
        "dims": {"batch": {"min": 2, "opt": 2, "max": 4}, "seq": {"min": 3, "opt": 6, "max": 8}},
    }
    dry_forward(NeedsAToken(), config_from_dict(raw))
