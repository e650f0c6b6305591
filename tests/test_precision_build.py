"""End-to-end INT8 builds for the cpu target: real photo calibration, validation, provenance, fallback report."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from test_calib_data import photo_folder

import edgedeploy
from edgedeploy.cli import main
from edgedeploy.errors import InputError
from edgedeploy.precision.data import hash_directory

NORMALIZED = 'checkpoint = "tiny.safetensors"\nnormalization = { mean = [0.5, 0.5, 0.5], std = [0.5, 0.5, 0.5] }'


def _normalized_project(tiny_project: Path) -> Path:
    text = tiny_project.read_text().replace('checkpoint = "tiny.safetensors"', NORMALIZED)
    tiny_project.write_text(text)
    return tiny_project


def test_cli_int8_build_with_image_folder(tiny_project: Path, tmp_path: Path, capsys) -> None:
    cfg = _normalized_project(tiny_project)
    calib = photo_folder(tmp_path / "photos", count=12, size=40)
    out = tmp_path / "int8-out"
    argv = ["build", "--config", str(cfg), "--out", str(out), "--target", "cpu", "--precision", "int8"]
    assert main([*argv, "--calib", str(calib)]) == 0
    assert "PASSED" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert {"model.int8.onnx", "precision.json"} <= set(manifest["artifacts"])
    report = json.loads((out / "report.json").read_text())
    cand = {c["name"]: c for c in report["parity"]["candidates"]}["onnxruntime-int8"]
    assert cand["status"] == "passed" and all(c["passed"] for c in cand["checks"])
    prec = report["metrics"]["precision"]
    assert prec["calibration"]["source_sha256"] == hash_directory(calib)
    assert prec["calibration"]["samples_used"] == 12
    assert prec["qdq_flavour"]["name"] == "U8S8" and prec["accuracy"]["score"] >= 0.99
    # a classifier output, no precision.accuracy_target: the gate's top-1 agreement, judged on 32 views of
    # each held-out photo (12 photos in batches of 2: the last 2 batches held out), observed and expected
    assert prec["accuracy_target"]["value"] == 0.95 and "min_topk_agreement" in prec["accuracy_target"]["why"]
    assert prec["judged_on"]["heldout_batches"] == 2 and prec["judged_on"]["views_per_heldout_batch"] == 32
    assert prec["judged_on"]["samples"] == 128
    acc = prec["accuracy"]
    assert acc["score"] == pytest.approx(min(acc["observed"], acc["expected"]) - acc["standard_error"], abs=1e-6)
    assert prec["judged_on"]["independent_groups"] == 2  # the two held-out batches with their views
    # the goldens hold the first six of those views, so the bundle's own check judges on samples the stage did
    from edgedeploy.modelio.goldens import load_goldens

    held = load_goldens(out / "goldens.npz")["calib-heldout"]
    assert sum(len(case["in"]["image"]) for case in held.values()) == 24
    assert any("12 samples, fewer than precision.calib_samples = 64" in w for w in report["warnings"])
    import onnx

    ops = {n.op_type for n in onnx.load(str(out / "model.int8.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops

    # same data: the precision stage comes from the cache; one changed photo: it runs again
    assert main([*argv, "--calib", str(calib)]) == 0
    stages = {s["name"]: s["status"] for s in json.loads((out / "report.json").read_text())["stages"]}
    assert stages["precision"] == "cached"
    (calib / "img000.png").write_bytes((calib / "img001.png").read_bytes())
    assert main([*argv, "--calib", str(calib)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert {s["name"]: s["status"] for s in report["stages"]}["precision"] == "ran"
    assert report["metrics"]["precision"]["calibration"]["source_sha256"] == hash_directory(calib)


def test_int8_without_calibration_data_fails_cleanly(tiny_project: Path) -> None:
    with pytest.raises(InputError, match="needs calibration data"):
        edgedeploy.build(tiny_project, log=lambda _: None, precision__mode="int8")
    assert not (tiny_project.parent / "out" / "model.int8.onnx").exists()


def test_int8_calibration_of_one_batch_is_refused_before_anything_is_judged_on_it(
    tiny_project: Path, tmp_path: Path, capsys
) -> None:
    """Two photos make one batch of two: nothing can be held out, and a model judged on its own calibration
    samples scores what it memorized. The build exits 3 with the fix, and writes no output; given
    validate.data, the same photos calibrate and the candidates are judged on validate.data instead."""
    cfg = _normalized_project(tiny_project)
    calib = photo_folder(tmp_path / "photos", count=2, size=40)
    out = tmp_path / "int8-out"
    argv = ["build", "--config", str(cfg), "--out", str(out), "--target", "cpu", "--precision", "int8"]
    assert main([*argv, "--calib", str(calib)]) == 3
    said, err = capsys.readouterr()
    assert "makes one batch (2 sample(s), 2 per batch)" in err and "at least 4 samples" in err
    assert "[1/7]" not in said + err  # refused from the folder listing, before any stage (no model loaded)
    np.save(tmp_path / "two.npy", np.random.default_rng(0).uniform(-1, 1, (2, 3, 16, 16)).astype(np.float32))
    assert main([*argv, "--calib", str(tmp_path / "two.npy")]) == 3  # from the array's header
    said, err = capsys.readouterr()
    assert "two.npy makes one batch (2 sample(s), 2 per batch)" in err and "[1/7]" not in said + err
    assert "validate.data" in err and not (out / "manifest.json").exists() and not (out / "model.int8.onnx").exists()
    real = np.random.default_rng(1).uniform(-1, 1, (4, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "real.npz", image=real)
    data = f'[validate]\ndata = "{(tmp_path / "real.npz").as_posix()}"\n'
    cfg.write_text(cfg.read_text().replace("[validate]\n", data))
    assert main([*argv, "--calib", str(calib)]) == 0
    prec = json.loads((out / "precision.json").read_text())
    assert prec["judged_on"]["calibration_batches"] == 1 and prec["judged_on"]["validate_data_batches"] >= 1
    assert prec["judged_on"]["heldout_batches"] == 0


OUTLIER_MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class OutlierNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 4, 3, padding=1)
            self.c2 = nn.Conv2d(4, 8, 3, padding=1)
            self.fc = nn.Linear(8, 10)
            self.register_buffer("gain", torch.tensor([1000.0, 1.0, 1.0, 1.0]).view(1, 4, 1, 1))

        def forward(self, image):
            y = torch.relu(self.c1(image)) * self.gain
            return self.fc(torch.relu(self.c2(y)).mean((2, 3)))


    def build():
        return OutlierNet()
    """
)


def outlier_int8_project(root: Path, validate: str = "", sections: str = "") -> Path:
    """A project under ``root``: the outlier CNN (one huge input channel: naive INT8 misses 0.99 top-1 agreement,
    so the fallback search runs), its checkpoint, a photo folder and an INT8 cpu deploy.toml. ``validate`` adds
    lines to ``[validate]``, ``sections`` whole sections before ``[build]``. Returns the project folder."""
    import torch
    from safetensors.torch import save_file

    proj = root / "outlier"
    proj.mkdir()
    mod = f"outlier_{root.name.replace('-', '_')}"
    (proj / f"{mod}.py").write_text(OUTLIER_MODEL)
    ns: dict = {}
    exec(compile(OUTLIER_MODEL, "outlier.py", "exec"), ns)  # the test's own model source
    torch.manual_seed(0)
    net = ns["build"]()
    with torch.no_grad():
        net.c2.weight[:, 0] *= 1e-3  # the huge channel and the small ones contribute alike
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(proj / "w.safetensors"))
    calib = photo_folder(root / "photos", count=24, size=40)
    (proj / "deploy.toml").write_text(
        textwrap.dedent(
            f"""
            outputs = ["logits"]
            [model]
            factory = "{mod}:build"
            checkpoint = "w.safetensors"
            normalization = {{ mean = [0.5, 0.5, 0.5], std = [0.5, 0.5, 0.5] }}
            [[inputs]]
            name = "image"
            shape = ["batch", 3, 16, 16]
            range = [-1.0, 1.0]
            [dims.batch]
            min = 1
            opt = 4
            max = 4
            [precision]
            mode = "int8"
            calib = "{calib}"
            calib_samples = 24
            accuracy_target = 0.99
            float_when_faster = false  # the fallback search is under test, not the speed probe
            [validate]
            samples = 1
            latency_warmup = 1
            """
        )
        + validate
        + sections
        + '\n[build]\nout = "out"\n'
    )
    return proj


def test_build_meets_accuracy_target_by_fallback_and_names_layers(tmp_path: Path) -> None:
    proj = outlier_int8_project(tmp_path, validate="latency_iters = 2\n")
    lines: list[str] = []
    result = edgedeploy.build(proj / "deploy.toml", log=lines.append)
    assert result.ok
    prec = result.report["metrics"]["precision"]
    tries = prec["fallback_tries"]
    assert tries[0]["score"] < 0.99 <= prec["accuracy"]["score"] and prec["accuracy"]["met"]
    # progress: one status per try, "try k of N", the best so far and why the search goes on; a closing summary
    search = [line for line in lines if "INT8 search: try" in line]
    assert len(search) == len(tries) and "try 0 (everything INT8), 0 float nodes" in search[0]
    assert all(f"INT8 search: try {t['try']}" in line for t, line in zip(tries, search))  # precision.json's numbers
    assert "best so far" in search[0] and "still searching" in search[0]
    assert any(line.strip().startswith(f"INT8 search: {len(tries)} tries") for line in lines)
    assert all(t["p50_ms"] > 0 for t in tries)  # each try timed: the speed axis of report.html's search plot
    import onnx

    kept = [k["node"] for k in prec["kept_float"]]
    nodes = {n.name: n for n in onnx.load(str(result.out / "model.int8.onnx")).graph.node}
    assert sorted(nodes[k].op_type for k in kept) == ["Conv", "Mul"]  # the outlier's producer and consumer
    mul, conv = sorted(kept, key=lambda k: nodes[k].op_type != "Mul")
    assert nodes[mul].output[0] == nodes[conv].input[0]  # the outlier tensor is no longer quantized
    assert all("INT8 sensitive" in k["why"] for k in prec["kept_float"])
    lat = prec["latency_onnxruntime_cpu"]
    assert lat["int8_final"]["p50_ms"] > 0 and lat["fallback_cost"] > 0
    assert any(
        "2 node(s) kept in float for accuracy" in w and mul in w and conv in w for w in result.report["warnings"]
    )
    plan = json.loads((result.out / "precision.json").read_text())
    assert plan["kept_float"] == prec["kept_float"]
    assert all("p50_ms" not in t for t in plan["fallback_tries"])  # timings stay out of the hashed file
    assert plan["calibration_range"]["image"]["declared"] == [-1.0, 1.0]


def test_jetson_orin_int8_that_passes_on_the_host_passes_its_own_dry_run(tiny_project: Path, tmp_path: Path) -> None:
    """The issue's case: a host INT8 build for jetson-orin said PASSED and its bundle's dry run then failed on
    the goldens. Now candidates are judged on held-out real samples and vetoed when they would fail the device
    check, and the goldens carry those held-out samples, so a passing build's dry run passes."""
    import subprocess
    import sys

    import numpy as np

    from edgedeploy.modelio.goldens import load_goldens
    from edgedeploy.precision.data import HELDOUT_POINT

    cfg = _normalized_project(tiny_project)
    calib = photo_folder(tmp_path / "photos", count=16, size=40)
    out = tmp_path / "orin-int8"
    result = edgedeploy.build(
        cfg,
        log=lambda _: None,
        build__target="jetson-orin",
        build__out=str(out),
        precision__mode="int8",
        precision__calib=str(calib),
    )
    assert result.report["status"] == "passed" and not result.ok  # passed here; validated on the device
    # the stand-in's Q/DQ graph as written says nothing of the device's speed: its tries are not timed
    assert all(t.get("p50_ms") is None for t in result.report["metrics"]["precision"]["fallback_tries"])
    prec = json.loads((out / "precision.json").read_text())
    assert prec["judged_on"]["heldout_batches"] >= 1 and prec["judged_on"]["calibration_batches"] >= 1
    assert prec["weights"]["bits"] == 8  # TensorRT: full 8-bit weights
    assert prec["accuracy"]["met"] and "vetoed" not in prec["accuracy"]
    bundle = out / "bundle"
    goldens = load_goldens(bundle / "goldens.npz")
    held = goldens[HELDOUT_POINT]
    assert held and all(np.abs(pair["in"]["image"]).max() <= 1.0 for pair in held.values())  # real photo crops
    # the held-out views are float16 values, stored as float16 and read back as float32 (here and on the device)
    with np.load(bundle / "goldens.npz") as stored:
        half = [k for k in stored.files if k.startswith(f"{HELDOUT_POINT}/") and "/half/" in k]
        assert half and all(stored[k].dtype == np.float16 for k in half)
    assert all(pair["in"]["image"].dtype == np.float32 for pair in held.values())
    proc = subprocess.run(
        [sys.executable, "complete_bundle.py", ".", "--runner", "onnxruntime"],
        cwd=bundle,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "PASSED" in proc.stderr
    validation = json.loads((bundle / "validation.json").read_text())
    assert any(c["shape"] == HELDOUT_POINT for c in validation["checks"])  # the device check saw real data


def test_precision_stage_vetoes_a_candidate_that_would_fail_the_device_check(tmp_path: Path) -> None:
    """A candidate meeting the held-out target but failing a golden at tolerance.int8 is not accepted."""
    import numpy as np
    from test_precision import _stage_ctx, outlier_net

    from edgedeploy.modelio.goldens import golden_key
    from edgedeploy.precision.goldens_veto import golden_cases, goldens_veto

    ctx = _stage_ctx(tmp_path, "jetson-orin", "int8", outlier_net(), {"accuracy_target": 0.5})
    feeds = {"image": np.full((1, 3, 16, 16), 0.5, np.float32)}
    wrong = {"logits": np.ones((1, 10), np.float32)}  # nothing the model can produce: the golden must fail
    np.savez(
        ctx.staging / "goldens.npz",
        **{golden_key("opt", 0, "in", "image"): feeds["image"], golden_key("opt", 0, "out", "logits"): wrong["logits"]},
    )
    cases = golden_cases(ctx.path("goldens.npz"))
    assert [c[0] for c in cases] == ["opt"]
    reason = goldens_veto(ctx.cfg, ctx.staging / "model.onnx", cases)
    assert reason and "golden opt#0 logits fails tolerance.int8" in reason
    # outputs the judge already made for a case are judged instead of running the model again
    assert goldens_veto(ctx.cfg, ctx.staging / "model.onnx", cases, known={0: wrong}) is None
    from edgedeploy.errors import StageError
    from edgedeploy.stages.precision import PrecisionFromOnnx

    with pytest.raises(StageError) as err:
        PrecisionFromOnnx().run(ctx)
    assert "tolerance.int8" in str(err.value)  # every try's veto is in the table
    assert "validate.data" in (err.value.hint or "") and "[tolerance.int8]" in err.value.hint


def test_int8_calibration_file_heldout_batches_are_judged_once(tiny_project: Path, tmp_path: Path) -> None:
    """A .npy calibration file without validate.data: its held-out quarter is the goldens' calib-heldout point,
    judged once by the precision stage, never relabelled as validate.data (which would count it twice)."""
    import numpy as np

    from edgedeploy.modelio.goldens import load_goldens

    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(3).uniform(-1, 1, (16, 3, 16, 16)).astype(np.float32))
    result = edgedeploy.build(
        tiny_project, log=lambda _: None, precision__mode="int8", precision__calib=str(calib), build__target="cpu",
        validate__goldens_budget_mb=0.001,
    )  # fmt: skip
    assert result.ok
    # over budget: the fix named is the one that shrinks what this file holds (no validate.data here)
    over = next(w for w in result.report["warnings"] if "goldens.npz is" in w)
    assert "lower precision.calib_samples" in over and "validate.data" not in over
    judged = json.loads((result.out / "precision.json").read_text())["judged_on"]
    # 16 samples in batches of 2: 8 batches, the last 2 held out (4 samples), no validate.data
    assert judged["heldout_batches"] == 2 and judged["validate_data_batches"] == 0
    assert judged["samples"] == 4 and judged["independent_groups"] == 2
    goldens = load_goldens(result.out / "goldens.npz")
    assert "data" not in goldens and len(goldens["calib-heldout"]) == 2
    rows = {c["name"]: c for c in result.report["parity"]["candidates"]}["onnxruntime-int8"]["checks"]
    assert "data" not in {r["shape"] for r in rows}
    assert "calib-heldout" in {r["shape"] for r in rows if r.get("agreement_judged")}


def test_goldens_views_are_on_the_float16_grid_for_int8_and_as_they_are_for_fp16(tiny_project: Path, tmp_path) -> None:
    """INT8 builds round the held-out views to float16 values (stored as float16 in goldens.npz); an FP16 build
    keeps them as they are, so its judge still sees the model round its own input to float16."""
    import numpy as np

    from edgedeploy.config import load_config
    from edgedeploy.precision.golden_feeds import heldout_calibration

    path = _normalized_project(tiny_project)
    calib = photo_folder(tmp_path / "photos", count=8, size=40)
    views = {
        mode: heldout_calibration(load_config(path, {"precision": {"mode": mode, "calib": str(calib)}}))
        for mode in ("int8", "fp16")
    }
    assert len(views["int8"]) == len(views["fp16"]) >= 6
    for int8, fp16 in zip(views["int8"], views["fp16"]):
        (x8,), (x16,) = int8.values(), fp16.values()
        assert x8.dtype == x16.dtype == np.float32
        assert np.array_equal(x8, x16.astype(np.float16).astype(np.float32))
    fp16_inputs = [x for v in views["fp16"] for x in v.values()]
    assert any(not np.array_equal(x, x.astype(np.float16).astype(np.float32)) for x in fp16_inputs)
