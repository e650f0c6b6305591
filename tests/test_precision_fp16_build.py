"""FP16 with a layer pinned to FP32, built end to end for every TensorRT generation, dry-run on the bundle.

The model's first conv reaches ~1e5 (> FP16 max 65504) before a Mul scales it back: the precision stage pins
both nodes. TensorRT <= 10 targets get the FP32 graph plus pins in plan.json / trtexec.sh; TensorRT 11 gets
an FP16 ONNX model with Casts. Either way the bundle carries the ONNX graph the engine is built from, and its own
dry run passes on FP16 numbers: the FP16 model itself, or (TensorRT <= 10) the FP16 simulation the build judged.
"""

from __future__ import annotations

import json
import textwrap
import uuid
import warnings

import pytest
from conftest import TINY_TOML
from test_bundle import run_device

from edgedeploy.api import build

# one xdist worker runs this module, so its module-scoped build fixture runs once (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_precision_fp16_build")

OVERFLOW_MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class OverflowNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 4, 3, padding=1)
            self.c2 = nn.Conv2d(4, 4, 3, padding=1)
            self.fc = nn.Linear(4, 5)

        def forward(self, image):
            y = torch.relu(self.c1(image) * 1e-5)  # c1's weights are x1e5: its output overflows FP16
            return self.fc(torch.relu(self.c2(y)).mean((2, 3)))


    def build():
        return OverflowNet()
    """
)


@pytest.fixture(scope="module")
def overflow_project(tmp_path_factory):
    import torch
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("fp16-project")
    name = f"overflownet_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(OVERFLOW_MODEL)
    ns: dict = {}
    exec(compile(OVERFLOW_MODEL, "overflownet.py", "exec"), ns)  # the test's own source
    torch.manual_seed(0)
    model = ns["build"]()
    with torch.no_grad():
        model.c1.weight.mul_(1e5)
        model.c1.bias.mul_(1e5)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "tiny.safetensors"))
    toml = TINY_TOML.replace("tinynet:build", f"{name}:build").replace("kwargs = { channels = 4, classes = 5 }\n", "")
    cfg = folder / "deploy.toml"
    cfg.write_text(toml)
    return cfg


@pytest.mark.parametrize("target", ["desktop", "desktop-trt11", "jetson-orin", "jetson-nano"])
def test_fp16_with_a_pinned_overflowing_layer_builds_and_its_bundle_dry_run_passes(overflow_project, target, tmp_path):
    out = tmp_path / "out"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = build(
            overflow_project, log=lambda s: None, build__target=target, build__out=str(out), precision__mode="fp16"
        )
    precision = json.loads((out / "precision.json").read_text())
    pins = sorted(p["node"] for p in precision["fp32_layers"])
    assert len(pins) == 2 and all("FP16 overflow" in p["why"] for p in precision["fp32_layers"])  # conv + mul
    assert precision["library_warnings"] == []
    assert not [w for w in caught if "float16" in str(w.message).lower()]  # no converter warning flood
    bundle = out / "bundle"
    graphs = sorted(p.name for p in bundle.glob("*.onnx"))
    plan = json.loads((bundle / "plan.json").read_text())
    simulated = [] if plan["strategy"] == "fp16-typed" else ["model.fp16-simulated.onnx"]
    assert graphs == sorted([plan["onnx"], *simulated])  # the graph the plan builds, and the dry run's FP16 one
    script = (bundle / "trtexec.sh").read_text()
    if target == "desktop-trt11":
        assert (plan["strategy"], plan["onnx"], plan["fp32_layers"]) == ("fp16-typed", "model.fp16.onnx", [])
        assert "--fp16" not in script and "--layerPrecisions" not in script
    else:
        assert (plan["strategy"], plan["onnx"]) == ("fp16-flag", "model.onnx")
        assert plan["fp32_layers"] == pins == plan["fp32_output_layers"]
        assert not (out / "model.fp16.onnx").exists()
        assert "--fp16" in script
        if target != "jetson-nano":  # TensorRT 8.2's trtexec has no per-layer flags (the Python build pins)
            spec = ",".join(f"{p}:fp32" for p in pins)
            assert f"--layerPrecisions={spec}" in script and f"--layerOutputTypes={spec}" in script
            assert "--precisionConstraints=obey" in script
    assert result.report["metrics"]["precision"]["host_check"]["score"] > 0.999
    proc = run_device(bundle, "--runner", "onnxruntime")
    assert proc.returncode == 0, proc.stderr
    proved = "proved fp16 (simulated)" if simulated else "proved fp16: the FP16 model"
    assert "PASSED" in proc.stderr and proved in proc.stderr
    validation = json.loads((bundle / "validation.json").read_text())
    assert validation["proved"].startswith("fp16")
    # FP16 numbers, not the FP32 model's: outputs differ from PyTorch by FP16 rounding
    assert max(c["max_abs"] for c in validation["checks"] if "max_abs" in c) > 1e-5


CANCEL_MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class CancelNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 4, 3, padding=1)
            self.b = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(4, 5)

        def forward(self, image):
            # two large convs that differ by a hair: FP16 rounding of each (no overflow) swamps their difference
            return self.fc(torch.relu((self.a(image) - self.b(image)) * 100.0).mean((2, 3)))


    def build():
        return CancelNet()
    """
)


def test_fp16_that_the_bundles_dry_run_would_fail_fails_the_build_with_the_golden_it_misses(tmp_path):
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from edgedeploy.errors import StageError

    name = f"cancelnet_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(CANCEL_MODEL)
    ns: dict = {}
    exec(compile(CANCEL_MODEL, "cancelnet.py", "exec"), ns)  # the test's own source
    torch.manual_seed(0)
    model = ns["build"]()
    with torch.no_grad():
        model.b.weight.copy_(model.a.weight * 300.0)
        model.a.weight.copy_(model.b.weight + 0.01 * torch.randn_like(model.b.weight))
        model.b.bias.copy_(model.a.bias)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "tiny.safetensors"))
    toml = TINY_TOML.replace("tinynet:build", f"{name}:build").replace("kwargs = { channels = 4, classes = 5 }\n", "")
    (tmp_path / "deploy.toml").write_text(toml)
    calib = np.random.default_rng(0).uniform(-1, 1, (64, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "calib.npy", calib)
    out = tmp_path / "out"
    with pytest.raises(StageError) as caught:
        build(
            tmp_path / "deploy.toml", log=lambda s: None, build__target="jetson-orin", build__out=str(out),
            precision__mode="fp16", precision__calib=str(tmp_path / "calib.npy"),
        )  # fmt: skip
    message = str(caught.value)
    assert "FP16 would fail the goldens check that validation and the bundle's dry run run" in message
    assert "real sample" in message and "fails tolerance.fp16" in message
    assert [p.name for p in out.iterdir()] == [".last-failed"]  # the failure's report, no partial artifact


ADC_MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class AdcNet(nn.Module):  # raw 16-bit ADC counts near 30000, centred and scaled inside the model
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, counts):
            return self.fc((counts - 30000.0) / 50.0)


    def build():
        return AdcNet()
    """
)


@pytest.mark.parametrize("target", ["jetson-orin", "desktop-trt11"])
def test_an_input_that_does_not_survive_fp16_fails_fp16_and_passes_with_its_reader_pinned(tmp_path, target):
    """The GPU stores an FP16 layer's input in FP16: counts near 30000 step by 16 there, which erases a signal
    of +-50. The simulation rounded weights and layer outputs but not graph inputs, so this model passed FP16 on
    every check; now the build fails naming the goldens it misses, and passes with the reading node in FP32."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from edgedeploy.errors import StageError

    name = f"adcnet_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(ADC_MODEL)
    ns: dict = {}
    exec(compile(ADC_MODEL, "adcnet.py", "exec"), ns)
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in ns["build"]().state_dict().items()}, str(tmp_path / "adc.safetensors"))
    (tmp_path / "deploy.toml").write_text(
        f'outputs = ["y"]\n[model]\nfactory = "{name}:build"\ncheckpoint = "adc.safetensors"\n'
        '[[inputs]]\nname = "counts"\nshape = ["batch", 8]\nrange = [29900.0, 30100.0]\n'
        "[dims.batch]\nmin = 1\nopt = 4\nmax = 8\n[validate]\nsamples = 1\nlatency_iters = 2\n"
    )
    calib = (30000 + np.random.default_rng(0).normal(0, 50, (64, 8))).astype(np.float32)
    np.save(tmp_path / "calib.npy", calib)
    kw = {"log": lambda s: None, "build__target": target, "precision__mode": "fp16"}
    kw["precision__calib"] = str(tmp_path / "calib.npy")
    with pytest.raises(StageError, match="FP16 would fail the goldens check") as caught:
        build(tmp_path / "deploy.toml", build__out=str(tmp_path / "out"), **kw)
    assert "fails tolerance.fp16" in str(caught.value)
    # the node reading the input (the exporter's name for ``counts - 30000``; an unknown name fails the build)
    build(tmp_path / "deploy.toml", build__out=str(tmp_path / "pinned"), precision__keep_fp32=["/Sub"], **kw)
    precision = json.loads((tmp_path / "pinned" / "precision.json").read_text())
    assert "/Sub" in [p["node"] for p in precision["fp32_layers"]]
    proc = run_device(tmp_path / "pinned" / "bundle", "--runner", "onnxruntime")  # the bundle's own check agrees
    assert proc.returncode == 0, proc.stderr
