"""A cached stage replays a result only when everything it read is unchanged: each test changes one input a
stage reads and checks the next build runs that stage again (a stale replay would publish old weights or an old
verdict)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import write_matmul_onnx, write_unique_tiny_project
from onnx import numpy_helper

from edgedeploy.cli import main
from edgedeploy.config import load_config


@pytest.fixture
def cache(test_cache: Path) -> Path:
    return test_cache


def _stages(out: Path) -> dict[str, str]:
    return {s["name"]: s["status"] for s in json.loads((out / "report.json").read_text())["stages"]}


def _given_onnx(folder: Path, weight: float) -> None:
    """``given.onnx`` (y = x @ W) with W in the external file ``given.onnx.data``: the same graph file for any W."""
    write_matmul_onnx(folder / "given.onnx", weight, external=True)


def test_a_given_onnx_models_external_weights_key_the_cache(tmp_path: Path, cache: Path) -> None:
    _given_onnx(tmp_path, 1.0)
    (tmp_path / "deploy.toml").write_text(
        '[model]\nonnx = "given.onnx"\n[dims.batch]\nmin = 1\nopt = 2\nmax = 4\n'
        "[validate]\nsamples = 1\nlatency_iters = 1\nlatency_warmup = 0\n"
    )
    cfg, out = str(tmp_path / "deploy.toml"), tmp_path / "out"
    assert main(["build", "-c", cfg, "--out", str(out)]) == 0
    (tmp_path / "given.onnx.data").write_bytes(np.full((8, 4), 3.0, np.float32).tobytes())  # the graph file as it was
    assert main(["build", "-c", cfg, "--out", str(out)]) == 0
    assert _stages(out)["export"] == "ran" and _stages(out)["reference"] == "ran"
    shipped = onnx.load(str(out / "model.onnx"))
    assert float(numpy_helper.to_array(next(i for i in shipped.graph.initializer if i.name == "W")).max()) == 3.0


def test_the_probe_seed_and_the_fp32_tolerance_key_capture_and_export(tmp_path: Path, cache: Path) -> None:
    """The probes' random sizes and inputs come from validate.seed; export holds their values to tolerance.fp32."""
    cfg = write_unique_tiny_project(tmp_path)
    out = tmp_path / "out"
    assert main(["build", "-c", str(cfg), "--out", str(out)]) == 0
    assert main(["build", "-c", str(cfg), "--out", str(out), "--seed", "3"]) == 0
    assert _stages(out)["capture"] == "ran" and _stages(out)["export"] == "ran"
    again = ["build", "-c", str(cfg), "--out", str(out), "--seed", "3", "--set", "tolerance.fp32.atol=0.001"]
    assert main(again) == 0
    assert _stages(out)["capture"] == "cached" and _stages(out)["export"] == "ran"


def test_how_calibration_data_is_loaded_keys_the_held_out_goldens(tmp_path: Path) -> None:
    """Which calibration samples are held out (and so never calibrated on) depends on how many are loaded."""
    from edgedeploy.precision.golden_feeds import heldout_key

    cfg = load_config(write_unique_tiny_project(tmp_path))
    np.save(tmp_path / "calib.npy", np.zeros((32, 3, 8, 8), np.float32))

    def with_precision(**fields):  # type: ignore[no-untyped-def]
        return dataclasses.replace(cfg, precision=dataclasses.replace(cfg.precision, mode="int8", **fields))

    keys = [json.dumps(heldout_key(with_precision(calib="calib.npy", calib_samples=n)), default=str) for n in (16, 32)]
    assert keys[0] != keys[1]


def test_a_hugging_face_folders_tokenizer_files_are_model_files(tmp_path: Path) -> None:
    from edgedeploy.pipeline.runner import _model_files

    folder = tmp_path / "bert"
    folder.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json", "model.safetensors"):
        (folder / name).write_text("{}")
    cfg = load_config(write_unique_tiny_project(tmp_path / "p"))
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, hf=str(folder), kwargs={"folder": str(folder)}))
    assert {p.name for p in _model_files(cfg)} == {"vocab.txt", "tokenizer_config.json"}


def test_installing_or_upgrading_a_package_runs_every_stage_again(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export, a quantization or a verdict made under other library versions is not replayed."""
    site = tmp_path / "site"
    (site / "somelib-1.0.dist-info").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(site))
    cfg = write_unique_tiny_project(tmp_path)
    out = tmp_path / "out"
    build = ["build", "-c", str(cfg), "--out", str(out)]
    assert main(build) == 0
    assert main(build) == 0
    stages = _stages(out)
    assert {stages[s] for s in ("capture", "export", "reference", "validate")} == {"cached"}
    (site / "somelib-1.0.dist-info").rename(site / "somelib-1.1.dist-info")  # pip install -U somelib
    assert main(build) == 0
    stages = _stages(out)
    assert {stages[s] for s in ("capture", "export", "reference", "validate")} == {"ran"}
    assert main(build) == 0
    assert _stages(out)["export"] == "cached"


def test_the_environment_lists_each_folders_packages_in_import_order(tmp_path: Path) -> None:
    from edgedeploy.fileio.environment import installed_distributions

    first, second, plain = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    layout = {first: ["numpy-2.0.dist-info", "old-1.0-py3.11.egg-info"], second: ["numpy-1.26.dist-info"]}
    for folder, names in layout.items():
        for name in names:
            (folder / name).mkdir(parents=True)
    (plain / "numpy").mkdir(parents=True)  # a package folder alone says no version: not listed
    archive = tmp_path / "lib.zip"
    archive.write_bytes(b"PK")
    paths = [str(first), str(archive), str(plain), str(tmp_path / "gone"), str(second)]
    assert installed_distributions(paths) == [
        (str(first), ["numpy-2.0.dist-info", "old-1.0-py3.11.egg-info"]),
        (str(second), ["numpy-1.26.dist-info"]),
    ]
    # which folder comes first decides which numpy imports
    assert installed_distributions(paths[::-1]) != installed_distributions(paths)
