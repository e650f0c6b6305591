"""``--target jetson --jetson NAME`` (``build.jetson``) names a Jetson profile; anything else is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy.cli import main

JETSONS = "jetson-orin, jetson-orin-nano, jetson-xavier, jetson-nano"
# off a Jetson (these tests never run on one: /proc/device-tree/model is absent) --target jetson means build.jetson


@pytest.mark.parametrize(
    ("jetson", "problem"),
    [
        ("cpu", "'cpu' is not a Jetson profile (the onnxruntime target for x86_64)"),
        ("desktop", "'desktop' is not a Jetson profile (an alias of --target)"),
        ("jetsn-orin", "unknown target 'jetsn-orin'"),
    ],
)
def test_a_jetson_default_that_is_no_jetson_profile_is_a_config_error(
    tiny_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], jetson: str, problem: str
) -> None:
    out = tmp_path / "out"
    code = main(["build", "-c", str(tiny_project), "--target", "jetson", "--jetson", jetson, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"deploy: config error: key 'build.jetson' (--jetson): {problem} -- fix: ")
    assert f"use one of {JETSONS}" in err
    assert not out.exists()


def test_a_jetson_profile_from_the_flag_is_built_for(
    tiny_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["-q", "build", "-c", str(tiny_project), "--target", "jetson", "--jetson", "jetson-orin-nano"]
    assert main([*argv, "--out", str(out)]) == 0
    assert "target jetson-orin-nano" in capsys.readouterr().out
