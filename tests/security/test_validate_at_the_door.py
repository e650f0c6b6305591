"""Bad input is refused at the door with one line naming it and a documented exit code, never a traceback."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

import edgedeploy
from edgedeploy.cli import main
from edgedeploy.config import load_config
from edgedeploy.errors import CheckpointError, ConfigError, InputError
from edgedeploy.fileio.outdir import check_free_space

QUIET = {"log": lambda _: None}


# ---- numeric config fields -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"tolerance": {"fp32": {"atol": -1.0}}}, "tolerance.fp32.atol"),
        ({"tolerance": {"fp32": {"atol": float("nan")}}}, "tolerance.fp32.atol"),
        ({"tolerance": {"fp16": {"min_cosine": 2.0}}}, "tolerance.fp16.min_cosine"),
        ({"gate": {"min_cosine": {"fp32": 2.0}}}, "gate.min_cosine.fp32"),
        ({"gate": {"max_latency_regression_pct": float("nan")}}, "gate.max_latency_regression_pct"),
        ({"validate": {"samples": 0}}, "validate.samples"),
        ({"validate": {"topk": 0}}, "validate.topk"),
    ],
)
def test_numbers_that_make_no_sense_are_config_errors_naming_the_key(tiny_project: Path, overrides, key):
    import tomllib

    raw = tomllib.loads(tiny_project.read_text())
    for section, values in overrides.items():
        raw.setdefault(section, {}).update(values)
    with pytest.raises(ConfigError, match=f"'{key}'"):
        edgedeploy.build(raw | {"build": {"out": str(tiny_project.parent / "out")}}, **QUIET)


def test_a_nan_input_range_is_a_config_error(tiny_project: Path, capsys):
    tiny_project.write_text(tiny_project.read_text().replace("range = [-1.0, 1.0]", "range = [nan, 1.0]"))
    assert main(["build", "-c", str(tiny_project)]) == ConfigError.exit_code
    assert "'inputs[0].range'" in capsys.readouterr().err


def test_a_gate_policy_file_with_min_cosine_2_is_a_config_error(tmp_path, capsys):
    policy = tmp_path / "gate.toml"
    policy.write_text("[gate]\nmin_cosine = { fp32 = 2.0 }\n")
    (tmp_path / "report.json").write_text(json.dumps({"schema": "edgedeploy-report/1", "status": "passed"}))
    assert main(["gate", str(tmp_path), "--policy", str(policy)]) == ConfigError.exit_code
    assert "'min_cosine.fp32'" in capsys.readouterr().err


def test_a_max_batch_of_a_billion_is_refused_before_allocating(tiny_project: Path):
    tiny_project.write_text(tiny_project.read_text().replace("max = 4", "max = 1000000000"))
    with pytest.raises(ConfigError, match=r"dims.batch.max = 1000000000.*GiB"):
        load_config(tiny_project)


def test_duplicate_output_names_are_refused(tiny_project: Path):
    tiny_project.write_text(tiny_project.read_text().replace('outputs = ["logits"]', 'outputs = ["logits", "logits"]'))
    with pytest.raises(ConfigError, match="'outputs' names \\['logits'\\] more than once"):
        load_config(tiny_project)


# ---- checkpoint dtypes -----------------------------------------------------------------------------


def _rewrite_checkpoint(project: Path, convert) -> Path:
    import torch
    from safetensors.torch import load_file

    state = load_file(str(project.parent / "tiny.safetensors"))
    path = project.parent / "tiny.pt"
    torch.save({k: convert(k, v) for k, v in state.items()}, str(path))
    return path


@pytest.mark.parametrize("dtype", ["int8", "bool", "complex64"])
def test_int8_bool_and_complex_checkpoints_are_refused(tiny_project: Path, dtype):
    import torch

    want = getattr(torch, dtype)
    ck = _rewrite_checkpoint(tiny_project, lambda k, v: v.to(want) if k == "fc.weight" else v)
    with pytest.raises(CheckpointError, match=f"fc.weight is {dtype}, the model's is float"):
        edgedeploy.build(tiny_project, model__checkpoint=str(ck), **QUIET)


def test_a_header_that_lies_about_the_dtype_is_flagged(tiny_project: Path):
    """int32 bytes read as float32: finite values of ~1e9 where weights are ~0.1."""
    import torch

    def lie(key, v):
        return (v * 1e9).to(torch.int32).view(torch.float32) * 0 + 1.5e9 if key == "conv.weight" else v

    ck = _rewrite_checkpoint(tiny_project, lie)
    with pytest.raises(CheckpointError, match="conv.weight holds values up to 1.5e\\+09, absurd"):
        edgedeploy.build(tiny_project, model__checkpoint=str(ck), **QUIET)


def test_no_checkpoint_is_a_warning_in_the_report(tiny_project: Path):
    text = tiny_project.read_text().replace('checkpoint = "tiny.safetensors"\n', "")
    tiny_project.write_text(text)
    result = edgedeploy.build(tiny_project, **QUIET)
    assert any("no model.checkpoint" in w and "random" in w for w in result.report["warnings"])


# ---- input spec against forward() -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        ('name = "image"\n', 'name = "image"\ndtype = "int64"\n', "rejects the inputs at their min shape"),
        ('shape = ["batch", 3, 16, 16]', 'shape = ["batch", 4, 16, 16]', "image \\[1, 4, 16, 16\\] float32"),
        ('shape = ["batch", 3, 16, 16]', 'shape = ["batch", 3, 16]', "image \\[1, 3, 16\\] float32"),
        (
            "[dims.batch]",
            '[[inputs]]\nname = "mask"\nshape = ["batch", 16]\n\n[dims.batch]',
            "the config has 2 inputs \\(image, mask\\) but TinyNet.forward takes 1 \\(image\\)",
        ),
    ],
    ids=["dtype", "channels", "rank", "extra-input"],
)
def test_an_input_spec_the_model_cannot_take_is_one_config_error(tiny_project: Path, capsys, old, new, expect):
    text = tiny_project.read_text()
    assert old in text
    tiny_project.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError, match=expect):
        edgedeploy.build(tiny_project, **QUIET)
    assert main(["build", "-c", str(tiny_project)]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert "Traceback" not in err and "config error:" in err


# ---- files ------------------------------------------------------------------------------------------


def test_a_zero_byte_onnx_fails_deploy_check(tmp_path, capsys):
    (tmp_path / "model.onnx").write_bytes(b"")
    assert main(["check", "--onnx", str(tmp_path / "model.onnx")]) == InputError.exit_code
    assert "empty (0 bytes)" in capsys.readouterr().err


def test_a_bundle_json_that_is_a_list_is_one_line(tmp_path, capsys):
    (tmp_path / "bundle.json").write_text("[]")
    assert main(["bundle", "verify", str(tmp_path)]) == InputError.exit_code
    assert "not a JSON object" in capsys.readouterr().err


@pytest.mark.parametrize("p50", [0.0, float("nan"), -1.0])
def test_a_baseline_with_p50_zero_or_nan_is_refused(tmp_path, capsys, p50):
    report = {"schema": "edgedeploy-report/1", "status": "passed", "latency": {"backends": {"ort": {"p50_ms": p50}}}}
    (tmp_path / "base.json").write_text(json.dumps(report))
    (tmp_path / "report.json").write_text(json.dumps(report | {"latency": {"backends": {"ort": {"p50_ms": 5.0}}}}))
    code = main(["gate", str(tmp_path / "report.json"), "--baseline", str(tmp_path / "base.json")])
    assert code == InputError.exit_code
    err = capsys.readouterr().err
    # 0 is no measurement; NaN and a negative figure are refused as the report is read
    assert "p50_ms" in err and ("is not a latency measurement" in err or "base.json: latency.backends" in err), err


def test_a_full_disk_during_a_build_is_one_line_and_leaves_the_old_output(tiny_project: Path, monkeypatch, capsys):
    first = edgedeploy.build(tiny_project, **QUIET)
    before = (first.out / "manifest.json").read_text()
    import numpy as np

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "goldens.npz")

    monkeypatch.setattr(np, "savez", full)
    code = main(["build", "-c", str(tiny_project), "--samples", "3"])
    err = capsys.readouterr().err
    assert code == InputError.exit_code, err
    assert "disk full while building" in err and "Traceback" not in err
    assert (first.out / "manifest.json").read_text() == before
    assert not list(first.out.parent.glob(".out.staging-*"))


def test_a_build_that_cannot_fit_on_the_disk_is_refused_before_it_starts(tmp_path):
    ck = tmp_path / "big.safetensors"
    ck.write_bytes(b"\0" * (1 << 20))
    with pytest.raises(InputError, match="not enough disk space"):
        check_free_space(tmp_path, ck, free=10 << 20)
    check_free_space(tmp_path, ck, free=1 << 30)
