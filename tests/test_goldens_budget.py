"""goldens.npz sized for a device: large spec-random inputs stored as seeds, the largest outputs sparingly."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
from test_bundle import RUN_ISOLATED

from edgedeploy.api import build
from edgedeploy.device.goldens_format import fit_budget, gen_entry, goldens_from_arrays, seeded_uniform
from edgedeploy.modelio.goldens import load_goldens, store_goldens

DETECTOR = textwrap.dedent(
    """
    from torch import nn


    def build():
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1))
    """
)


def _detector_project(folder: Path) -> Path:
    """A fully convolutional model (28-parameter class) with dynamic batch up to 8 and H x W up to 480 x 640."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    name = f"detector_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(DETECTOR)
    ns: dict = {}
    exec(compile(DETECTOR, "detector.py", "exec"), ns)  # the test's own model source
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in ns["build"]().state_dict().items()}, str(folder / "w.safetensors"))
    (folder / "deploy.toml").write_text(
        textwrap.dedent(
            f"""
            outputs = ["heatmap"]
            [model]
            factory = "{name}:build"
            checkpoint = "w.safetensors"
            [[inputs]]
            name = "image"
            shape = ["batch", 3, "h", "w"]
            range = [0.0, 1.0]
            [dims.batch]
            min = 1
            opt = 2
            max = 8
            [dims.h]
            min = 32
            opt = 240
            max = 480
            [dims.w]
            min = 32
            opt = 320
            max = 640
            [export]
            exporter = "torchscript"
            [build]
            target = "jetson-orin"
            out = "out"
            """
        )
    )
    return folder / "deploy.toml"


def test_seeded_inputs_regenerate_bit_for_bit() -> None:
    arrays = {"max/0/gen/image": gen_entry(123, [2, 3, 4], -1.0, 1.0, "float32")}
    regenerated = goldens_from_arrays(arrays)["max"][0]["in"]["image"]
    # numpy's legacy stream: the same values on the device's numpy as here
    assert np.array_equal(regenerated, np.random.RandomState(123).uniform(-1.0, 1.0, (2, 3, 4)).astype(np.float32))
    assert np.array_equal(regenerated, seeded_uniform(123, [2, 3, 4], -1.0, 1.0, "float32"))


def test_budget_stores_the_largest_spec_random_outputs_sparingly_and_real_ones_last() -> None:
    arrays = {
        "max/0/out/y": np.arange(100_000, dtype=np.float32),
        "opt/0/out/y": np.arange(10_000, dtype=np.float32),
        "data/0/out/y": np.arange(200_000, dtype=np.float32),
    }
    fitted = fit_budget(arrays, budget=900_000, protect=["data"])
    assert list(fitted["sparse"]) == ["max/0/out/y"] and fitted["within_budget"]
    goldens = goldens_from_arrays(arrays)
    shape, stride = goldens["max"][0]["sparse"]["y"]
    assert shape == [100_000] and np.array_equal(goldens["max"][0]["out"]["y"], np.arange(100_000)[::stride])
    assert "y" not in goldens["data"][0]["sparse"]  # real samples kept whole while the budget allows


@pytest.mark.slow  # ~40 s: PyTorch and ONNX Runtime at 8 x 3 x 480 x 640
def test_detector_goldens_fit_the_budget_and_its_bundle_dry_run_passes(tmp_path: Path) -> None:
    result = build(_detector_project(tmp_path / "proj"), log=lambda _: None)
    assert result.report["status"] == "passed"
    size = result.report["metrics"]["reference"]["goldens_size"]
    goldens = result.out / "bundle" / "goldens.npz"
    assert size["within_budget"] and goldens.stat().st_size <= size["budget_bytes"] == 8_000_000
    assert size["inputs_stored_as_seeds"] >= 4 and any(k.startswith("max/") for k in size["outputs_stored_sparingly"])
    loaded = load_goldens(goldens)
    assert loaded["max"][0]["in"]["image"].shape == (8, 3, 480, 640)
    assert loaded["max"][0]["sparse"]["heatmap"][0] == [8, 2, 480, 640]
    proc = subprocess.run(
        [sys.executable, "-I", "-c", RUN_ISOLATED, "complete_bundle.py", ".", "--runner", "onnxruntime"],
        cwd=result.out / "bundle",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "PASSED" in proc.stderr, proc.stderr
    checks = json.loads((result.out / "bundle" / "validation.json").read_text())["checks"]
    assert {c["shape"] for c in checks} == {"min", "opt", "max"} and all(c["passed"] for c in checks)
    assert any(c.get("stored_every") for c in checks if c["shape"] == "max")


def test_float32_inputs_that_are_float16_values_are_stored_in_half_the_bytes_and_read_back_equal() -> None:
    rng = np.random.default_rng(0)
    on_grid = rng.standard_normal((2, 3, 8, 8)).astype(np.float16).astype(np.float32)
    on_grid[0, 0, 0, :3] = [-0.0, 65504.0, 2.0**-24]  # signed zero, the largest float16, its smallest subnormal
    off_grid = on_grid + np.float32(1e-4)  # not float16 values
    ids = np.arange(8, dtype=np.int64).reshape(1, 8)
    arrays: dict[str, np.ndarray] = {}
    store_goldens(arrays, "data", 0, {"image": on_grid, "other": off_grid, "ids": ids}, {"y": np.ones(3, np.float32)})
    assert arrays["data/0/half/image"].dtype == np.float16 and arrays["data/0/half/image"].nbytes == on_grid.nbytes // 2
    assert "data/0/in/other" in arrays and "data/0/in/ids" in arrays and "data/0/in/image" not in arrays
    read = goldens_from_arrays(arrays)["data"][0]["in"]
    assert read["image"].dtype == np.float32 and np.array_equal(read["image"].view(np.uint32), on_grid.view(np.uint32))
    assert np.array_equal(read["other"], off_grid) and np.array_equal(read["ids"], ids)


def test_a_half_entry_that_is_not_float16_is_refused() -> None:
    with pytest.raises(ValueError, match="unreadable entry 'data/0/half/image'"):
        goldens_from_arrays({"data/0/half/image": np.zeros((1, 3), np.float32)})
