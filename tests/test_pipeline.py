"""End-to-end cpu builds of a tiny real model: artifacts, manifest, cache, atomic failure handling."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import use_default_exporter

import edgedeploy
from edgedeploy.errors import CheckpointError, ConfigError, InputError
from edgedeploy.fileio.hashing import sha256_file


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize("exporter", ["default", "torchscript"])
def test_build_writes_artifacts_manifest_and_report(tiny_project: Path, exporter: str):
    if exporter == "default":
        use_default_exporter(tiny_project)
    result = edgedeploy.build(tiny_project, log=lambda _: None)
    out = result.out
    assert result.ok
    for name in ("model.onnx", "report.json", "manifest.json", "goldens.npz", "model.ts"):
        assert (out / name).is_file(), name
    manifest = json.loads((out / "manifest.json").read_text())
    for name, sha in manifest["artifacts"].items():
        assert sha256_file(out / name) == sha
    assert manifest["inputs"]["checkpoint"]["sha256"] == sha256_file(tiny_project.parent / "tiny.safetensors")
    assert {"python", "torch", "onnx", "onnxruntime"} <= set(manifest["tools"])
    assert all("seconds" in s for s in manifest["stages"])
    report = json.loads((out / "report.json").read_text())
    checks = [c for c in report["parity"]["candidates"][0]["checks"] if c["check"] == "parity"]
    assert {c["shape"] for c in checks} == {"min", "opt", "max"}
    assert all(c["max_abs"] < 1e-4 and c["passed"] for c in checks)
    assert not list(out.glob(".staging-*"))


@pytest.mark.parametrize("exporter", ["default", "torchscript"])
def test_onnx_runs_at_a_batch_never_used_during_export(tiny_project: Path, exporter: str):
    import onnxruntime as ort

    if exporter == "default":
        use_default_exporter(tiny_project)
    result = edgedeploy.build(tiny_project, log=lambda _: None)
    sess = ort.InferenceSession(str(result.out / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).uniform(-1, 1, (3, 3, 16, 16)).astype(np.float32)  # batch 3: not min/opt/max
    (y,) = sess.run(None, {"image": x})
    assert y.shape == (3, 5)
    import torch

    model = edgedeploy.load_config(tiny_project)
    from edgedeploy.modelio.checkpoint import load_model

    net = load_model(model, model.path(model.model.checkpoint))
    with torch.no_grad():
        ref = net(torch.from_numpy(x)).numpy()
    assert np.abs(ref - y).max() < 1e-4


def test_second_run_is_cached_and_fast(tiny_project: Path):
    first = edgedeploy.build(tiny_project, log=lambda _: None)
    second = edgedeploy.build(tiny_project, log=lambda _: None)
    done = [s.name for s in first.stages if s.status != "skipped"]  # ran, or cached by an earlier test's build
    assert [s.name for s in second.stages if s.status == "cached"] == done
    assert all(s.status in ("cached", "skipped") for s in second.stages)
    # the same verdict, marked as restored from the cache (not judged again in this run)
    assert second.report["parity"] == {**first.report["parity"], "cached": True}


def test_changing_a_validation_field_reruns_only_validate(tiny_project: Path):
    edgedeploy.build(tiny_project, log=lambda _: None)
    again = edgedeploy.build(tiny_project, log=lambda _: None, validate__latency_iters=3)
    status = {s.name: s.status for s in again.stages}
    assert status["validate"] == "ran"
    assert status["export"] == status["capture"] == status["reference"] == "cached"


def test_changing_the_checkpoint_reruns_dependents(tiny_project: Path):
    import torch
    from safetensors.torch import load_file, save_file

    edgedeploy.build(tiny_project, log=lambda _: None)
    ck = tiny_project.parent / "tiny.safetensors"
    state = load_file(str(ck))
    state["fc.bias"] = state["fc.bias"] + 1.0
    save_file({k: v.contiguous() for k, v in state.items()}, str(ck))
    again = edgedeploy.build(tiny_project, log=lambda _: None)
    status = {s.name: s.status for s in again.stages}
    assert status["reference"] == status["export"] == status["validate"] == "ran"
    assert isinstance(torch.__version__, str)


def test_failed_run_leaves_previous_good_output_intact(tiny_project: Path):
    first = edgedeploy.build(tiny_project, log=lambda _: None)
    before = _snapshot(first.out)
    ck = tiny_project.parent / "tiny.safetensors"
    ck.write_bytes(ck.read_bytes()[:100])  # truncated
    said: list[str] = []
    with pytest.raises(CheckpointError):
        edgedeploy.build(tiny_project, log=said.append)
    assert _snapshot(first.out) == before
    assert f"previous output in {first.out} left as it was" in said[-1]
    fresh = tiny_project.parent / "never-built"
    with pytest.raises(CheckpointError):  # nothing was there: the line does not claim an output it kept
        edgedeploy.build(tiny_project, log=said.append, build__out=str(fresh))
    assert f"no output in {fresh} before" in said[-1] and "left as it was" not in said[-1]
    failed = json.loads((first.out / ".last-failed" / "report.json").read_text())
    assert failed["status"] == "failed" and failed["error"]["exit_code"] == 3
    assert not list(first.out.glob(".staging-*"))


def test_validation_data_outside_dims_is_rejected(tiny_project: Path):
    data = tiny_project.parent / "val.npz"
    np.savez(data, image=np.zeros((9, 3, 16, 16), np.float32))  # batch 9 > max 4
    with pytest.raises(InputError, match=r"dim 'batch' \(axis 0\) = 9 is outside \[1, 4\]"):
        edgedeploy.build(tiny_project, log=lambda _: None, validate__data=str(data))


def test_validation_data_is_judged_for_what_it_holds_before_the_model_is(tiny_project: Path):
    data = tiny_project.parent / "val.npz"
    bad = np.zeros((2, 3, 16, 16), np.float32)
    bad[1, 0, 3, 4] = np.nan
    np.savez(data, image=bad)
    with pytest.raises(InputError, match=r"val.npz: image: holds 1 NaN/Inf value\(s\)") as err:
        edgedeploy.build(tiny_project, log=lambda _: None, validate__data=str(data))
    assert "repair the samples of image" in err.value.one_line()  # the file is at fault, not the model
    np.savez(data, image=np.zeros((2, 3, 16, 16), np.int64))
    with pytest.raises(InputError, match="image: dtype int64, the input is float32") as err:
        edgedeploy.build(tiny_project, log=lambda _: None, validate__data=str(data))
    assert "save image as float32" in err.value.one_line()
    np.savez(data, img=np.zeros((2, 3, 16, 16), np.float32))  # one array for one input: read as that input
    assert edgedeploy.build(tiny_project, log=lambda _: None, validate__data=str(data)).ok


def test_feeds_that_do_not_fit_the_spec_get_the_fix_for_what_is_wrong(tiny_project: Path):
    from edgedeploy.modelio.inputs import check_feeds

    cfg = edgedeploy.load_config(tiny_project)
    with pytest.raises(InputError) as err:
        check_feeds(cfg, {"img": np.zeros((1, 3, 16, 16), np.float32)}, "v.npz")
    assert "fix: name the arrays after the model's inputs: image" in err.value.one_line()
    with pytest.raises(InputError) as err:
        check_feeds(cfg, {"image": np.zeros((1, 16, 16, 3), np.float32)}, "v.npz")
    assert "axis 1 is 16, spec fixes it at 3" in err.value.one_line()
    assert "fix: give image arrays of shape ['batch', 3, 16, 16]" in err.value.one_line()


def test_a_factory_that_raises_is_named_at_its_line_and_a_bad_keyword_at_the_kwargs(tiny_project: Path):
    broken = tiny_project.parent / "broken_factory.py"
    broken.write_text("def build(**kwargs):\n    size = 3\n    raise RuntimeError(f'boom {size}')\n")
    with pytest.raises(ConfigError) as err:
        edgedeploy.build(tiny_project, log=lambda _: None, model__factory="broken_factory:build", model__kwargs={})
    line = err.value.one_line()
    assert (
        "raised RuntimeError: boom 3 (at broken_factory.py:3)" in line
        and "fix the factory at broken_factory.py:3" in line
    )
    with pytest.raises(ConfigError) as err:
        edgedeploy.build(tiny_project, log=lambda _: None, model__kwargs={"nope": 1})
    assert "unexpected keyword argument 'nope'" in err.value.one_line()
    assert "check model.kwargs against the factory's parameters" in err.value.one_line()


def test_factory_that_does_not_import(tiny_project: Path):
    with pytest.raises(ConfigError, match="cannot find module 'no_such_module'"):
        edgedeploy.build(tiny_project, log=lambda _: None, model__factory="no_such_module:build")


def test_checkpoint_for_another_model(tiny_project: Path):
    with pytest.raises(CheckpointError, match="does not fit model"):
        edgedeploy.build(tiny_project, log=lambda _: None, model__kwargs={"channels": 8, "classes": 5})


def test_nan_producing_reference_is_a_stage_error(tiny_project: Path):
    import torch
    from safetensors.torch import load_file, save_file

    from edgedeploy.errors import StageError

    ck = tiny_project.parent / "tiny.safetensors"
    state = load_file(str(ck))
    state["fc.weight"] = torch.full_like(state["fc.weight"], float("nan"))
    save_file({k: v.contiguous() for k, v in state.items()}, str(ck))
    with pytest.raises(StageError, match="NaN"):
        edgedeploy.build(tiny_project, log=lambda _: None)
