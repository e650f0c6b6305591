"""The same inputs give a byte-identical device bundle: two cold builds, one bundle sha256."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import edgedeploy
from edgedeploy.fileio.hashing import sha256_file
from edgedeploy.fileio.stable import stable_json


def _cold_build(project: Path, out: Path, calib: Path) -> edgedeploy.api.BuildResult:
    return edgedeploy.build(
        project,
        log=lambda _: None,
        # a TensorRT-target bundle builds without TensorRT (docs/bundles.md); TensorRT 8.5 also has calib.cache
        build__target="jetson-xavier",
        build__out=str(out),
        build__cache=False,
        precision__mode="int8",
        precision__calib=str(calib),
    )


def test_two_cold_int8_bundle_builds_have_the_same_sha256(tiny_project: Path, tmp_path: Path):
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).uniform(-1, 1, size=(8, 3, 16, 16)).astype(np.float32))
    a = _cold_build(tiny_project, tmp_path / "a", calib)
    b = _cold_build(tiny_project, tmp_path / "b", calib)
    files = json.loads((a.out / "bundle" / "bundle.json").read_text())["files"]
    differ = [n for n in files if sha256_file(a.out / "bundle" / n) != sha256_file(b.out / "bundle" / n)]
    assert differ == []
    assert a.report["metrics"]["build"]["bundle_sha256"] == b.report["metrics"]["build"]["bundle_sha256"]
    # timings are measured (they differ run to run) and live in the report, not in the hashed precision.json
    precision = json.loads((a.out / "bundle" / "precision.json").read_text())
    assert "latency_onnxruntime_cpu" in a.report["metrics"]["precision"]
    assert "latency_onnxruntime_cpu" not in precision
    for out in (a.out, b.out):  # written on every TensorRT 8.x int8 build, shipped when the plan uses it
        names = [ln.split(":")[0] for ln in (out / "calib.cache").read_text().splitlines()[1:]]
        assert names == sorted(names)


def test_stable_json_drops_timings_at_any_depth_and_sorts_keys():
    text = stable_json({"b": 1, "a": {"latency_ms": 3.2, "tries": [{"seconds": 1.0, "score": 0.99}]}, "p50_ms": 1})
    assert json.loads(text) == {"a": {"tries": [{"score": 0.99}]}, "b": 1}
    assert text.index('"a"') < text.index('"b"')
