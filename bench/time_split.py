"""Wall seconds of the named steps of one cold ``deploy build`` (each step's function wrapped with a timer, no
profiler overhead), for the EfficientNet-Lite0 project of bench/build_times.py: INT8 by default (the judge,
the quantizer, bias correction, calibration, the goldens veto, the validate backends, the report).

The build runs in this process with an empty stage cache, as a ``deploy build`` process would (OpenMP waits
bounded before torch loads). Calls and seconds per step; a step's time includes the steps it calls. The
fallback tries' wall time (from the end of the all-INT8 try's judgement to the end of the last try's) is split
from the rest of the build.

    PYTHONPATH=$PWD .venv/bin/python bench/time_split.py [--fp32] [--target jetson-orin] [--json bench/time_split.json]

``--target`` builds for another target (default ``cpu``): for a TensorRT target the host stages only, with the
INT8 search judged on the Q/DQ graph as written.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

STEPS = (
    ("edgedeploy.precision.analysis", "accuracy_until_decided", "the held-out judge, per try"),
    ("edgedeploy.precision.analysis", "run_model", "other ONNX Runtime runs: the float reference, ranked models"),
    ("edgedeploy.precision.quantize", "Quantizer.quantize", "each try's model (includes the two below)"),
    ("edgedeploy.precision.quantize", "Quantizer.calibrate", "calibration (histograms; once, then reused)"),
    ("edgedeploy.precision.bias_correction", "output_mean_shifts", "bias correction's mean shifts"),
    ("edgedeploy.precision.fallback", "layer_sensitivity", "the node ranking: one model per quantized node"),
    ("edgedeploy.precision.speed_probe", "interleaved_p50", "the speed probe's and the bisection rule's timing"),
    ("edgedeploy.precision.goldens_veto", "goldens_veto", "the goldens veto"),
    ("edgedeploy.precision.search_progress", "SearchProgress.__call__", "each try's latency line"),
    ("edgedeploy.precision.golden_feeds", "golden_arrays", "PyTorch goldens (reference stage)"),
    ("edgedeploy.stages.validate", "ParityFromGoldens._validate_backend", "validate, per backend"),
    ("edgedeploy.pipeline.report", "write_report_files", "report files (plots included)"),
)


def wrap(module: str, attr: str, seconds: dict[str, float], calls: collections.Counter) -> None:
    owner: Any = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def timed(*args: Any, **kwargs: Any) -> Any:
        key = attr
        if name == "_validate_backend":
            key += f" [{args[2].name}]"
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            seconds[key] += time.perf_counter() - t0
            calls[key] += 1

    setattr(owner, name, timed)


def main() -> int:
    from edgedeploy.pipeline.threads import bounded_blas_waits, bounded_thread_waits

    waits = bounded_thread_waits()  # before anything below imports torch, as a build's process does
    blas = bounded_blas_waits()  # and numpy, as the deploy command does
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp32", action="store_true", help="the FP32 build instead of INT8")
    ap.add_argument("--target", default="cpu", help="the build target (default cpu)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from build_times import compile_bytecode, side_by_side_projects

    compile_bytecode()
    seconds: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    for module, attr, _ in STEPS:
        wrap(module, attr, seconds, calls)
    # when each try's judgement ended: the fallback tries are what lies between the first (all-INT8) and the last
    ends: list[float] = []
    progress: Any = importlib.import_module("edgedeploy.precision.search_progress").SearchProgress
    timed_call = progress.__call__

    def noting_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        ends.append(time.perf_counter())
        return timed_call(self, *args, **kwargs)

    progress.__call__ = noting_end
    from edgedeploy.cli import main as deploy

    with tempfile.TemporaryDirectory() as tmp:
        cfg = side_by_side_projects(Path(tmp))["efficientnet_lite0"]["config"]
        os.environ["EDGEDEPLOY_CACHE_DIR"] = str(Path(tmp) / "cache")
        argv = ["build", "--config", str(cfg), "--out", str(Path(tmp) / "out"), "--target", args.target]
        if not args.fp32:
            argv += ["--precision", "int8", "--calib", str(cfg.parent / "photos")]
        load = round(os.getloadavg()[0], 1)
        t0 = time.perf_counter()
        rc = deploy(argv)
        wall = time.perf_counter() - t0
    what = {attr: why for _, attr, why in STEPS}
    rows = [
        {"step": key, "what": what[key.split(" [")[0]], "calls": calls[key], "seconds": round(sec, 2)}
        for key, sec in sorted(seconds.items(), key=lambda kv: -kv[1])
    ]
    doc = {
        "command": "PYTHONPATH=$PWD python bench/time_split.py " + " ".join(sys.argv[1:]),
        "build": "fp32" if args.fp32 else "int8",
        "target": args.target,
        "exit_code": rc,
        "wall_s": round(wall, 2),
        "load_avg_1min": [load, round(os.getloadavg()[0], 1)],
        "thread_waits": waits,
        "blas_waits": blas,
        "steps": rows,
    }
    if len(ends) > 1:  # the wall time of the fallback tries, and of everything else the build did
        doc["fallback_tries"] = {"tries": len(ends) - 1, "seconds": round(ends[-1] - ends[0], 2)}
        doc["without_fallback_tries_s"] = round(wall - (ends[-1] - ends[0]), 2)
    for row in rows:
        print(f"{row['seconds']:7.2f} s  x{row['calls']:<3d} {row['step']}  ({row['what']})")
    print(f"build wall {doc['wall_s']} s, exit {rc}, load {doc['load_avg_1min']}")
    if "fallback_tries" in doc:
        tries = doc["fallback_tries"]
        print(f"fallback tries: {tries['tries']} in {tries['seconds']} s; the rest {doc['without_fallback_tries_s']} s")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
