"""A calibration layout that puts no image's channels on the channel axis names who set it (the flag or the file)
and the input's own layout as the value to use."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgedeploy.cli import main


def _images(folder: Path) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray((rng.random((16, 16, 3)) * 255).astype("uint8")).save(folder / f"{i}.png")
    return folder


def _err(capsys: pytest.CaptureFixture[str], cfg: Path, tmp_path: Path, *extra: str) -> tuple[int, str]:
    calib = _images(tmp_path / "imgs")
    argv = ["build", "-c", str(cfg), "--target", "cpu", "--precision", "int8", "--calib", str(calib)]
    code = main([*argv, "--out", str(tmp_path / "out"), *extra])
    return code, capsys.readouterr().err.strip()


def test_a_layout_from_the_flag_blames_the_flag_and_names_the_inputs_layout(
    tiny_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _err(capsys, tiny_project, tmp_path, "--calib-layout", "NHWC")
    assert code == 2
    assert err == (
        "deploy: config error: --calib-layout (precision.calib_layout) = 'NHWC' puts 16 channels on axis 3 of "
        "input 'image'; images give 1 or 3 -- fix: use --calib-layout NCHW (the layout of input 'image': "
        "3 channels on axis 1)"
    )


def test_a_layout_from_the_file_blames_the_file(
    tiny_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tiny_project.read_text().replace("[validate]", '[precision]\ncalib_layout = "NHWC"\n\n[validate]')
    tiny_project.write_text(text)
    code, err = _err(capsys, tiny_project, tmp_path)
    assert code == 2
    assert err.startswith(f"deploy: config error: {tiny_project}: key 'precision.calib_layout' = 'NHWC' puts 16")
    assert err.endswith(
        "-- fix: set precision.calib_layout = \"NCHW\" (the layout of input 'image': 3 channels on axis 1)"
    )
