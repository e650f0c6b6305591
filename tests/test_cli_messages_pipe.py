"""A command whose stdout reader has gone (``deploy targets | head -3``) exits quietly, not with a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgedeploy.cli import EXIT_STDOUT_CLOSED


@pytest.mark.parametrize("argv", [["targets"], ["targets", "--json"]])
def test_a_closed_stdout_ends_the_command_quietly(argv: list[str]) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a byte: every write to stdout breaks the pipe
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "edgedeploy", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert proc.stderr == ""
    assert proc.returncode == EXIT_STDOUT_CLOSED == 141
