"""A TensorRT workspace larger than the target's memory is refused before any stage runs, naming that memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy.cli import main


def test_a_workspace_beyond_the_targets_memory_is_refused_before_any_stage(
    tiny_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["build", "-c", str(tiny_project), "--target", "jetson-orin-nano", "--out", str(out)]
    code = main([*argv, "--workspace-mib", "99999"])
    captured = capsys.readouterr()
    assert code == 4
    assert captured.err == (
        "deploy: target capability error: build.workspace_mib (--workspace-mib) 99999 MiB exceeds target "
        "'jetson-orin-nano' memory (8192 MiB) -- fix: use --workspace-mib 8192 or less (the target's memory; "
        "without the flag it gets 256 MiB)\n"
    )
    assert "[1/" not in captured.out  # no stage started
    assert not out.exists() and not (tiny_project.parent / "out").exists()
    # the limit the fix names is one the build accepts
    assert main(["-q", *argv, "--workspace-mib", "8192"]) == 0
