"""The CLI: exit codes per error class, one-line messages, flags that override config fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgedeploy.cli import main
from edgedeploy.errors import EXIT_CODES


def test_build_and_flag_overrides(tiny_project: Path, tmp_path: Path, capsys):
    out = tmp_path / "flag-out"
    code = main(["build", "--config", str(tiny_project), "--out", str(out), "--samples", "1", "--seed", "3"])
    assert code == 0
    assert (out / "model.onnx").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["validate"]["seed"] == 3
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--target", "jetson-orn"], 2, "did you mean 'jetson-orin'"),
        (["--opset", "abc"], 2, "--opset"),
        (["--precision", "int9"], 2, "precision.mode"),
        (["--checkpoint", "/nonexistent/ck.safetensors"], 3, "checkpoint not found"),
    ],
)
def test_error_exit_codes(tiny_project: Path, capsys, args, code, needle):
    assert main(["build", "--config", str(tiny_project), *args]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert needle in err[-1]


def test_capability_error_exit_code(tiny_project: Path, capsys):
    assert main(["build", "--config", str(tiny_project), "--target", "jetson-nano", "--precision", "int8"]) == 4
    assert "jetson-nano" in capsys.readouterr().err


def test_unknown_config_key_exit_code(tiny_project: Path, capsys):
    tiny_project.write_text(tiny_project.read_text().replace("[validate]", "[validate]\nsampels = 2"))
    assert main(["build", "--config", str(tiny_project)]) == 2
    err = capsys.readouterr().err
    assert "validate.sampels" in err and "did you mean 'samples'" in err and str(tiny_project) in err


def test_pickled_checkpoint_exit_code(tiny_project: Path, tmp_path: Path, capsys):
    import torch

    evil = tmp_path / "evil.pt"
    torch.save(torch.nn.Linear(1, 1), evil)
    assert main(["build", "--config", str(tiny_project), "--checkpoint", str(evil)]) == 3
    assert "pickled code" in capsys.readouterr().err


def test_exit_codes_are_distinct():
    """Each error family has its own exit code: two classes share one only when one subclasses the other."""
    import inspect

    from edgedeploy import errors

    classes = [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.DeployError) and c is not errors.DeployError
    ]
    by_code: dict[int, list[type]] = {}
    for c in classes:
        by_code.setdefault(c.exit_code, []).append(c)
    for code, group in by_code.items():
        root = min(group, key=lambda c: len(c.__mro__))
        unrelated = [c.__name__ for c in group if not issubclass(c, root)]
        assert not unrelated, f"exit code {code} is shared by {root.__name__} and unrelated {unrelated}"
    assert 0 not in by_code and 1 not in by_code  # success and internal errors stay distinguishable
    assert set(EXIT_CODES) == set(by_code) | {0, 1}  # every code documented, no stale entries


def test_targets_lists_every_profile(capsys):
    from edgedeploy.targets import all_targets

    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    for name in all_targets():
        assert name in out


def test_python_dash_m_and_console_script(tmp_path: Path):
    # Both entry points reach the same CLI: a listing exits 0, a missing config exits 2 with one line. (A full
    # `python -m edgedeploy build` runs in tests/security/test_output_folder.py's concurrent-builds test.)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    script = Path(sys.executable).parent / "deploy"
    assert script.is_file(), "the `deploy` console script is not installed (pip install -e .)"
    for entry in ([sys.executable, "-m", "edgedeploy"], [str(script)]):
        listing = subprocess.run([*entry, "targets"], capture_output=True, text=True, env=env, timeout=120)
        assert listing.returncode == 0, listing.stderr
        assert "jetson-orin" in listing.stdout
        bad = subprocess.run(
            [*entry, "build", "--config", str(tmp_path / "missing.toml")],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert bad.returncode == 2, (entry, bad.stderr)
        assert bad.stderr.strip().count("\n") == 0 and "config file not found" in bad.stderr


def test_bundle_only_build_never_reads_as_validated(tiny_project: Path, tmp_path: Path, capsys):
    code = main(["build", "--config", str(tiny_project), "--target", "jetson-orin", "--precision", "fp16",
                 "--out", str(tmp_path / "orin")])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "parity skipped here, checked on the device" in out
    assert "engine not built here" in out
    assert not list((tmp_path / "orin").rglob("*.engine"))
