"""Checkpoint reading never unpickles code and names every problem."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edgedeploy.errors import CheckpointError
from edgedeploy.modelio.checkpoint import read_state_dict


class _Payload:
    """Pickles to a call that would create a marker file if it were ever executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_pickled_code_is_refused_without_executing(tmp_path: Path):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    torch.save({"weight": torch.zeros(2), "payload": _Payload(marker)}, path)
    with pytest.raises(CheckpointError, match="pickled code") as err:
        read_state_dict(path)
    assert not marker.exists()
    assert str(path) in err.value.one_line()


def test_plain_state_dict_pt_loads(tmp_path: Path):
    path = tmp_path / "ok.pt"
    torch.save({"state_dict": {"w": torch.ones(3)}}, path)
    assert torch.equal(read_state_dict(path)["w"], torch.ones(3))


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_truncated_checkpoint(tmp_path: Path, suffix: str):
    from safetensors.torch import save_file

    path = tmp_path / f"t{suffix}"
    tensors = {"w": torch.randn(64, 64)}
    if suffix == ".pt":
        torch.save(tensors, path)
    else:
        save_file(tensors, str(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        read_state_dict(path)


def test_garbage_and_empty_and_missing(tmp_path: Path):
    garbage = tmp_path / "g.safetensors"
    garbage.write_bytes(b"\x00\x01not a checkpoint" * 10)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        read_state_dict(garbage)
    empty = tmp_path / "e.pt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        read_state_dict(empty)
    with pytest.raises(CheckpointError, match="not found"):
        read_state_dict(tmp_path / "missing.pt")


def test_whole_module_pickle_is_refused(tmp_path: Path):
    path = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(2, 2), path)
    with pytest.raises(CheckpointError, match="pickled code") as err:
        read_state_dict(path)
    line = err.value.one_line()
    assert "torch.nn.modules.linear.Linear" in line  # the global the file asks for
    assert "\x1b" not in line and "can still be loaded" not in line  # no colour codes, no how-to-load-it-anyway
