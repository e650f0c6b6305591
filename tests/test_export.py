"""Export stage: both exporters, opset choice, fallback, baked-shape probes, external data, simplification."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from test_capture import BAKED_MODEL, GOOD_MODEL, make_config, quiet

from edgedeploy.artifacts import ONNX_DATA, ONNX_MODEL
from edgedeploy.errors import StageError, TargetCapabilityError
from edgedeploy.onnxtools.export import EXPORTER_OPSETS, choose_opset, exporter_order
from edgedeploy.pipeline.manifest import read_manifest
from edgedeploy.pipeline.runner import run_build
from edgedeploy.stages.export import OnnxFromTorch
from edgedeploy.targets import get_target

# tests about what the stage does around the exporter (not the exporter itself) pin the faster one
TORCHSCRIPT_IS_FASTER = "torchscript"

# Python control flow on a tensor value: torch.export cannot capture it, tracing can
DATA_BRANCH_MODEL = """
import torch
from torch import nn


class Branchy(nn.Module):
    def forward(self, x):
        if x.abs().sum() > -1:
            return x * 2
        return x


def build():
    return Branchy()
"""


def _opset(path: Path) -> int:
    import onnx

    model = onnx.load(str(path))
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_both_exporters_keep_batch_dynamic_and_pass_probes(tmp_path: Path, exporter: str) -> None:
    import onnx

    cfg = make_config(tmp_path, GOOD_MODEL, export={"exporter": exporter})
    result = run_build(cfg, stages=[OnnxFromTorch()], log=quiet)
    metrics = result.report["metrics"]["export"]
    assert metrics["exporter"] == exporter
    assert metrics["opset"] == min(21, EXPORTER_OPSETS[exporter][1])  # cpu parses up to 21
    assert _opset(result.out / ONNX_MODEL) == metrics["opset"]
    probes = {"opt": True, "batch=1 (min)": True, "batch=4 (max)": True, "batch=3 (random)": True}
    probes["range edges"] = True
    assert metrics["shape_probes"] == probes
    assert metrics["simplify"]["status"] == "kept"
    model = onnx.load(str(result.out / ONNX_MODEL))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["edgedeploy.exporter"] == exporter
    assert {"edgedeploy.inputs", "edgedeploy.normalization", "edgedeploy.class_names"} <= set(meta)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_named_dim_whose_size_never_varies_is_exported_at_its_size(tmp_path: Path, exporter: str) -> None:
    # a symbolic dim that never varies only makes TensorRT ask for an optimization profile, and DLA refuse it
    import onnx

    fixed = {"batch": {"min": 2, "opt": 2, "max": 2}}
    cfg = make_config(tmp_path, GOOD_MODEL, dims=fixed, export={"exporter": exporter})
    result = run_build(cfg, stages=[OnnxFromTorch()], log=quiet)
    model = onnx.load(str(result.out / ONNX_MODEL))
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [2, 3, 4, 4]
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_value == 2


def test_opset_follows_the_target_and_exporter(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, GOOD_MODEL)
    nano, orin, cpu = get_target("jetson-nano"), get_target("jetson-orin"), get_target("cpu")
    assert exporter_order(cfg, nano) == ["torchscript", "dynamo"]  # opset 13 is below dynamo's native 18
    assert exporter_order(cfg, orin) == ["dynamo", "torchscript"]
    assert choose_opset(cfg, nano, "torchscript") == 13
    assert choose_opset(cfg, orin, "dynamo") == 20
    assert choose_opset(cfg, cpu, "torchscript") == 20
    assert choose_opset(cfg, cpu, "dynamo") == 21
    pinned = make_config(tmp_path / "p", GOOD_MODEL, export={"opset": 12, "exporter": "torchscript"})
    assert choose_opset(pinned, nano, "torchscript") == 12


def test_explicit_opset_above_target_ceiling_is_refused(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, GOOD_MODEL, export={"opset": 17}, build={"target": "jetson-nano"})
    with pytest.raises(TargetCapabilityError) as err:
        run_build(cfg, stages=[OnnxFromTorch()], log=quiet)
    assert "export.opset = 17" in err.value.message and "max opset 13" in err.value.message
    assert err.value.exit_code == 4


def test_old_target_exports_with_torchscript_at_its_opset(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, GOOD_MODEL, build={"target": "jetson-nano"})
    result = run_build(cfg, stages=[OnnxFromTorch()], log=quiet)
    assert result.report["metrics"]["export"]["exporter"] == "torchscript"
    assert _opset(result.out / ONNX_MODEL) == 13


def test_auto_falls_back_and_says_why(tmp_path: Path) -> None:
    # dynamo cannot export a branch on tensor data; the TorchScript exporter traces it (its TracerWarning accepted)
    cfg = make_config(tmp_path, DATA_BRANCH_MODEL, export={"fail_on_tracer_warnings": False})
    result = run_build(cfg, stages=[OnnxFromTorch()], log=quiet)
    metrics = result.report["metrics"]["export"]
    assert metrics["exporters_tried"] == ["dynamo", "torchscript"]
    assert metrics["exporter"] == "torchscript"
    warning = next(w for w in result.report["warnings"] if "exporter failed" in w)
    assert "dynamo" in warning and metrics["fallback_reason"].split(":")[0] == "dynamo"
    assert metrics["tracer_warnings"][0].split(": ")[1].startswith("Converting a tensor to a Python boolean")


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_baked_shape_fails_naming_the_dim(tmp_path: Path, exporter: str) -> None:
    cfg = make_config(tmp_path, BAKED_MODEL, export={"exporter": exporter})
    with pytest.raises(StageError) as err:
        run_build(cfg, stages=[OnnxFromTorch()], log=quiet)
    assert "batch" in err.value.message
    if exporter == "torchscript":  # exported fine, the probe caught it; the user's line froze it: that is named
        assert "'batch'" in err.value.message and "`n = int(x.size(0))`" in err.value.message
        assert "write `x.size(0)` instead of `int(x.size(0))`" in (err.value.hint or "")
    assert not (tmp_path / "out" / ONNX_MODEL).exists()


def test_large_weights_go_to_external_data(tmp_path: Path) -> None:
    import onnx
    import onnxruntime as ort

    wide = GOOD_MODEL.replace("nn.Conv2d(3, 4, 3", "nn.Conv2d(3, 4, 5").replace("padding=1", "padding=2")
    cfg = make_config(tmp_path, wide)  # conv weight 4x3x5x5 floats: above the 1 KiB external-tensor minimum
    result = run_build(cfg, stages=[OnnxFromTorch(external_data_threshold=64)], log=quiet)
    assert result.report["metrics"]["export"]["external_data"] is True
    data = result.out / ONNX_DATA
    assert data.is_file() and data.stat().st_size > 64
    assert ONNX_DATA in read_manifest(result.out)["artifacts"]
    model = onnx.load(str(result.out / ONNX_MODEL), load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    sess = ort.InferenceSession(str(result.out / ONNX_MODEL), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": np.zeros((3, 3, 4, 4), np.float32)})
    assert y.shape == (3, 5)


def test_small_weights_stay_inline(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, GOOD_MODEL, export={"exporter": TORCHSCRIPT_IS_FASTER})
    result = run_build(cfg, stages=[OnnxFromTorch()], log=quiet)
    assert not (result.out / ONNX_DATA).exists()
    assert result.report["metrics"]["export"]["external_data"] is False


def test_simplification_that_changes_outputs_is_discarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx
    import onnxslim
    from onnx import numpy_helper

    from edgedeploy.onnxtools.simplify import simplify_checked

    cfg = make_config(tmp_path, GOOD_MODEL, export={"simplify": False, "exporter": TORCHSCRIPT_IS_FASTER})
    result = run_build(cfg, stages=[OnnxFromTorch()], log=quiet)
    proto = onnx.load(str(result.out / ONNX_MODEL))
    feeds = [{"x": np.random.default_rng(0).uniform(-1, 1, (2, 3, 4, 4)).astype(np.float32)}]
    kept, info = simplify_checked(proto, feeds)
    assert info["status"] == "kept" and info["max_abs_vs_unsimplified"] <= 1e-5

    real_slim = onnxslim.slim

    def slim_that_perturbs_weights(model: onnx.ModelProto, **kwargs: object) -> onnx.ModelProto:
        out = real_slim(model, **kwargs)
        init = max(out.graph.initializer, key=lambda t: int(np.prod(t.dims)))
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + 0.5, init.name))
        return out

    monkeypatch.setattr(onnxslim, "slim", slim_that_perturbs_weights)
    kept, info = simplify_checked(proto, feeds)
    assert info["status"] == "discarded" and "differ" in info["reason"]
    assert kept is proto


def test_export_is_cached_by_content(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, GOOD_MODEL, export={"exporter": TORCHSCRIPT_IS_FASTER})
    cfg = dataclasses.replace(cfg, build=dataclasses.replace(cfg.build, cache=True))
    first = run_build(cfg, stages=[OnnxFromTorch()], log=quiet)
    second = run_build(cfg, stages=[OnnxFromTorch()], log=quiet)
    assert first.stages[0].status == "ran" and second.stages[0].status == "cached"


def test_external_data_travels_into_the_bundle_without_duplicate_copies(tmp_path: Path) -> None:
    from edgedeploy.stages.build_trt import BundleFromOnnx
    from edgedeploy.stages.reference import GoldensFromTorch

    wide = GOOD_MODEL.replace("nn.Conv2d(3, 4, 3", "nn.Conv2d(3, 4, 5").replace("padding=1", "padding=2")
    cfg = make_config(tmp_path, wide, build={"target": "jetson-orin"})
    stages = [GoldensFromTorch(), OnnxFromTorch(external_data_threshold=64), BundleFromOnnx()]
    result = run_build(cfg, stages=stages, log=quiet)
    bundle = result.out / "bundle"
    assert (bundle / ONNX_DATA).is_file()
    assert f"bundle/{ONNX_DATA}" in read_manifest(result.out)["artifacts"]
    listed = json.loads((bundle / "bundle.json").read_text())["files"]
    assert ONNX_DATA in listed
    # the bundle's model files are the same inodes as OUT's: no second copy on disk
    assert (bundle / ONNX_MODEL).stat().st_ino == (result.out / ONNX_MODEL).stat().st_ino


def test_one_export_serves_targets_with_the_same_opset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cpu and a TensorRT target at the same opset and exporter share the cached reference and export (with
    exporter = "auto" they may not: cpu's trace capture lets it take the cheaper TorchScript exporter)."""
    from edgedeploy.stages import pipeline_stages
    from edgedeploy.targets import get_target

    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(tmp_path / "shared-cache"))
    first = make_config(tmp_path / "a", GOOD_MODEL, export={"opset": 20, "exporter": "dynamo"}, build={"cache": True})
    run_build(first, log=quiet)
    orin = {"cache": True, "target": "jetson-orin"}
    second = make_config(tmp_path / "b", GOOD_MODEL, export={"opset": 20, "exporter": "dynamo"}, build=orin)
    second = dataclasses.replace(second, model=dataclasses.replace(second.model, factory=first.model.factory))
    second = dataclasses.replace(second, base_dir=first.base_dir)
    stages = pipeline_stages(get_target("jetson-orin"))
    result = run_build(second, stages=stages, log=quiet)
    status = {r.name: r.status for r in result.stages}
    assert status["reference"] == status["export"] == "cached"
    assert status["capture"] == "skipped"  # nothing consumes a TorchScript program for a TensorRT target


def test_cheapest_first_takes_torchscript_only_where_the_trace_capture_proved_tracing() -> None:
    from edgedeploy.onnxtools.export import cheapest_first

    order = ["dynamo", "torchscript"]
    clean = {"route": "trace", "tracer_warnings": ["lstm.py:1 ..."], "tracer_warnings_library": 1}
    assert cheapest_first(order, clean)[0] == ["torchscript", "dynamo"]
    user = {"route": "trace", "tracer_warnings": ["model.py:3 ..."], "tracer_warnings_library": 0}
    assert cheapest_first(order, user)[0] == order  # a frozen Python value in the user's code: dynamo first
    assert cheapest_first(order, {"route": "export"})[0] == order
    assert cheapest_first(order, None)[0] == order  # no capture ran (TensorRT targets)
    assert cheapest_first(["torchscript", "dynamo"], None)[0] == ["torchscript", "dynamo"]


def test_auto_exports_with_torchscript_after_a_clean_trace_capture(tmp_path: Path) -> None:
    from edgedeploy.stages.capture import TorchScriptFromModel

    cfg = make_config(tmp_path, GOOD_MODEL)
    result = run_build(cfg, stages=[TorchScriptFromModel(), OnnxFromTorch()], log=quiet)
    metrics = result.report["metrics"]
    assert metrics["capture"]["route"] == "trace"
    assert metrics["export"]["exporter"] == "torchscript" and metrics["export"]["exporters_tried"] == ["torchscript"]
    assert "trace capture matched eager" in metrics["export"]["exporter_order_why"]


def test_export_probes_reuse_the_capture_stages_eager_outputs_on_the_same_feeds(tmp_path: Path) -> None:
    """One eager pass per probe point per build: the export stage takes the capture stage's outputs when its
    feeds are the same arrays, and runs the model itself otherwise."""
    import torch

    from edgedeploy.onnxtools.shapes import PROBE_SEED, probe_feeds, probe_points
    from edgedeploy.stages.export import _Probe

    cfg = make_config(tmp_path, GOOD_MODEL)
    calls: list[int] = []

    def model(x: torch.Tensor) -> torch.Tensor:
        calls.append(len(x))
        return torch.zeros(len(x), 5)

    feeds = probe_feeds(
        cfg, probe_points(cfg, seed=cfg.validate.seed + PROBE_SEED), seed=cfg.validate.seed + PROBE_SEED
    )
    known = [{"y": np.full((len(f["x"]), 5), 7.0, np.float32)} for f in feeds]
    probe = _Probe(cfg, model, (feeds, known))
    assert calls == [] and probe.references == known
    other = [{"x": f["x"] + 1} for f in feeds]
    probe = _Probe(cfg, model, (other, known))  # not the same inputs: measured, not reused
    assert len(calls) == len(feeds) and all(not r["y"].any() for r in probe.references)


def test_simplification_infers_shapes_once_and_folds_as_much_as_onnxslim_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shapes come from one inference before onnxslim (ONNX Runtime's symbolic one, onnx's own where that
    fails), and the simplified graph is the one onnxslim makes when it infers shapes itself after every round."""
    import onnx
    import onnxslim
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from edgedeploy.onnxtools.simplify import simplify_checked

    cfg = make_config(tmp_path, GOOD_MODEL, export={"simplify": False, "exporter": TORCHSCRIPT_IS_FASTER})
    proto = onnx.load(str(run_build(cfg, stages=[OnnxFromTorch()], log=quiet).out / ONNX_MODEL))
    feeds = [{"x": np.random.default_rng(0).uniform(-1, 1, (2, 3, 4, 4)).astype(np.float32)}]

    def ops(model: onnx.ModelProto) -> list[str]:
        return [n.op_type for n in model.graph.node]

    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    by_onnxslim = ops(onnxslim.slim(copy))
    copy.CopyFrom(proto)
    without_shapes = ops(onnxslim.slim(copy, no_shape_infer=True))
    assert len(without_shapes) > len(by_onnxslim)  # the batch-size Shape chain folds only with shapes known

    kept, info = simplify_checked(proto, feeds)
    assert info["status"] == "kept" and ops(kept) == by_onnxslim
    assert [o.type for o in kept.graph.output] == [o.type for o in proto.graph.output]  # declared dims kept

    def refuses(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no symbolic rule")

    monkeypatch.setattr(SymbolicShapeInference, "infer_shapes", staticmethod(refuses))
    kept, info = simplify_checked(proto, feeds)
    assert info["status"] == "kept" and ops(kept) == without_shapes  # what onnx's inference lets it fold
    assert len(kept.graph.value_info) > 0  # onnx's inference stood in (onnxslim alone would leave none)


def test_a_failed_export_offers_only_the_fixes_left_to_try(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from edgedeploy.stages.export import _export_fix
    from edgedeploy.targets import get_target

    cfg = make_config(tmp_path / "p", GOOD_MODEL)
    nano = SimpleNamespace(cfg=cfg, target=get_target("jetson-nano"))  # parses opset 13 at most
    both = _export_fix(nano, ["torchscript", "dynamo"])  # type: ignore[arg-type]
    assert "export.exporter" not in both and "higher export.opset" not in both
    assert "opset 13 is the most target 'jetson-nano' parses" in both
    one = _export_fix(SimpleNamespace(cfg=cfg, target=get_target("cpu")), ["dynamo"])  # type: ignore[arg-type]
    assert "try export.exporter = 'torchscript'" in one


# the right shapes at every size, other values away from the example: a branch on a size, a pool over it
BRANCH_ON_SIZE_MODEL = """
import torch
from torch import nn
import torch.nn.functional as F


class Centred(nn.Module):
    def forward(self, x):
        if x.shape[0] > 1:  # fixed at export, at the example's batch
            x = x - x.mean(0, keepdim=True)
        return x * 2


class Pooled(nn.Module):
    def forward(self, x):
        return F.avg_pool1d(x, x.shape[-1])  # a kernel of the example's length


def build():
    return Centred()


def pooled():
    return Pooled()
"""


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_an_export_with_the_right_shapes_and_other_values_fails_naming_the_dim(tmp_path: Path, exporter: str) -> None:
    """The export probes compare values within the FP32 tolerance, not shapes only: on a TensorRT target the
    host runs nothing else at the min and max shapes."""
    cfg = make_config(
        tmp_path, BRANCH_ON_SIZE_MODEL, inputs=[{"name": "x", "shape": ["batch", 8]}],
        dims={"batch": {"min": 1, "opt": 4, "max": 8}}, export={"exporter": exporter}, build={"target": "jetson-orin"},
    )  # fmt: skip
    with pytest.raises(StageError) as err:
        run_build(cfg, stages=[OnnxFromTorch()], log=quiet)
    assert "'batch'" in err.value.message, err.value.message
    assert not (tmp_path / "out" / ONNX_MODEL).exists()
    module = cfg.model.factory.split(":")[0]
    pooled = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, factory=f"{module}:pooled"))
    pooled = dataclasses.replace(
        pooled,
        inputs=(dataclasses.replace(cfg.inputs[0], shape=(2, 3, "n")),),
        dims={"n": dataclasses.replace(next(iter(cfg.dims.values())), min=5, opt=8, max=15)},
    )
    with pytest.raises(StageError, match="'n'"):
        run_build(pooled, stages=[OnnxFromTorch()], log=quiet)
