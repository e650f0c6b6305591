"""Refusals that depend only on config, target and data presence happen before any model is loaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgedeploy.config import config_from_dict
from edgedeploy.errors import InputError, TargetCapabilityError
from edgedeploy.pipeline.runner import run_build


def _cfg(tmp_path: Path, **sections: dict[str, Any]) -> Any:
    raw: dict[str, Any] = {
        # a factory that cannot be imported: any refusal raised before it is touched is an early one
        "model": {"factory": "no_such_module_anywhere:build"},
        "inputs": [{"name": "x", "shape": ["batch", 3], "range": [-1.0, 1.0]}],
        "dims": {"batch": {"min": 1, "opt": 2, "max": 4}},
        "outputs": ["y"],
        "build": {"out": str(tmp_path / "out")},
    }
    for key, value in sections.items():
        raw.setdefault(key, {}).update(value)
    return config_from_dict(raw, source="deploy.toml", base_dir=tmp_path)


def test_int8_without_calibration_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="INT8 needs calibration data"):
        run_build(_cfg(tmp_path, precision={"mode": "int8"}), log=lambda _l: None)
    assert not (tmp_path / "out").exists()


def test_precision_the_target_refuses_is_refused_first(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, precision={"mode": "fp16"}, build={"target": "cpu"})
    with pytest.raises(TargetCapabilityError, match="cannot run fp16"):
        run_build(cfg, log=lambda _l: None)
    assert not (tmp_path / "out").exists()


def test_what_the_target_cannot_do_is_refused_before_a_missing_file(tmp_path: Path) -> None:
    # INT8 on jetson-nano (TensorRT 8.2 on Maxwell: no INT8) with a calibration file that does not exist: the
    # capability is the answer (exit 4); finding the file would not make the build possible
    cfg = _cfg(tmp_path, precision={"mode": "int8", "calib": "missing.npy"}, build={"target": "jetson-nano"})
    with pytest.raises(TargetCapabilityError, match="cannot run int8"):
        run_build(cfg, log=lambda _l: None)
    assert not (tmp_path / "out").exists()


def test_missing_or_text_data_without_hf_folder_is_refused_first(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="(validate.data: file|validation data) not found"):
        run_build(_cfg(tmp_path, validate={"data": "missing.npz"}), log=lambda _l: None)
    (tmp_path / "s.txt").write_text("the cat\n")
    cfg = _cfg(tmp_path, precision={"mode": "int8", "calib": "s.txt"})
    with pytest.raises(InputError, match="needs a Hugging Face model folder"):
        run_build(cfg, log=lambda _l: None)


def test_cli_refusal_imports_no_torch(tmp_path: Path) -> None:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(
        'outputs = ["y"]\n[model]\nfactory = "m:build"\n[[inputs]]\nname = "x"\nshape = [1, 3]\n'
        '[precision]\nmode = "int8"\n'
    )
    script = (
        "import sys\nfrom edgedeploy.cli import main\n"
        f"rc = main(['build', '--config', {str(cfg)!r}])\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc)\n"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "NO-TORCH 3" in res.stdout, res.stdout + res.stderr[-2000:]


def test_dynamic_image_size_without_calib_resize_is_refused_before_any_stage(tmp_path: Path) -> None:
    """An image folder for an input with dynamic height/width needs precision.calib_resize: refused from the
    config and a directory listing, before the model is imported or any stage runs."""
    from edgedeploy.errors import ConfigError

    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.jpg").write_bytes(b"never opened")
    cfg = config_from_dict(
        {
            "model": {"factory": "no_such_module_anywhere:build"},
            "inputs": [{"name": "image", "shape": ["batch", 3, "h", "w"]}],
            "dims": {d: {"min": 8, "opt": 16, "max": 32} for d in ("batch", "h", "w")},
            "outputs": ["y"],
            "precision": {"mode": "int8", "calib": "photos"},
            "build": {"out": str(tmp_path / "out")},
        },
        source="deploy.toml",
        base_dir=tmp_path,
    )
    lines: list[str] = []
    with pytest.raises(ConfigError) as err:
        run_build(cfg, log=lines.append)
    assert "dynamic height/width" in err.value.message and "--calib-resize" in (err.value.hint or "")
    assert not [ln for ln in lines if ln.startswith("[")]  # no stage line: reference, capture, export never ran
    assert not (tmp_path / "out").exists()


def test_array_files_that_do_not_fit_the_inputs_are_refused_before_the_model_loads(tmp_path: Path) -> None:
    """.npy / .npz names and validation shapes come from the files' headers: refused before any stage."""
    import numpy as np

    np.savez(tmp_path / "wrong_shape.npz", x=np.zeros((2, 5), np.float32))  # spec: [batch, 3]
    with pytest.raises(InputError, match=r"axis 1 is 5, spec fixes it at 3"):
        run_build(_cfg(tmp_path, validate={"data": "wrong_shape.npz"}), log=lambda _l: None)
    np.savez(tmp_path / "other_name.npz", a=np.zeros((2, 3), np.float32), b=np.zeros((2, 3), np.float32))
    with pytest.raises(InputError, match=r"no array for input\(s\) x \(has a, b\)"):
        run_build(_cfg(tmp_path, precision={"mode": "int8", "calib": "other_name.npz"}), log=lambda _l: None)
    np.save(tmp_path / "one.npy", np.zeros((4, 3), np.float32))
    two = config_from_dict(
        {
            "model": {"factory": "no_such_module_anywhere:build"},
            "inputs": [{"name": n, "shape": ["batch", 3]} for n in ("x", "y")],
            "dims": {"batch": {"min": 1, "opt": 2, "max": 4}},
            "outputs": ["z"],
            "precision": {"mode": "int8", "calib": "one.npy"},
            "build": {"out": str(tmp_path / "out")},
        },
        source="deploy.toml",
        base_dir=tmp_path,
    )
    with pytest.raises(InputError, match="holds one array and the model has 2 inputs"):
        run_build(two, log=lambda _l: None)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a NumPy array file"):
        run_build(_cfg(tmp_path, validate={"data": "junk.npz"}), log=lambda _l: None)
    assert not (tmp_path / "out").exists()


def test_a_typo_in_the_gate_table_and_no_timed_runs_are_named_with_their_fix(tmp_path: Path) -> None:
    from edgedeploy.errors import ConfigError

    with pytest.raises(ConfigError, match=r"unknown key 'gate.min_cosin'") as caught:
        _cfg(tmp_path, gate={"min_cosin": {"fp32": 0.9}})
    assert caught.value.hint == "did you mean 'min_cosine'?"
    with pytest.raises(ConfigError, match=r"'validate.latency_iters' = 0 must be >= 1"):
        _cfg(tmp_path, validate={"latency_iters": 0})


def test_a_failed_build_with_json_prints_its_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import textwrap

    from edgedeploy.cli import main
    from edgedeploy.errors import ParityError

    (tmp_path / "constant.py").write_text(
        textwrap.dedent(
            """
            import torch

            class Constant(torch.nn.Module):
                def forward(self, x):
                    return x.sum(1, keepdim=True) * 0.0 + 1.0

            def build():
                return Constant()
            """
        )
    )
    code = main(
        ["build", "--factory", "constant:build", "--input", "x:batchx3", "--dim", "batch=1:2:4", "--python-path",
         str(tmp_path), "--out", str(tmp_path / "out"), "--json"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == ParityError.exit_code and "vacuous" in err
    report = json.loads(out)
    assert report["status"] == "failed" and report["error"]["exit_code"] == code
