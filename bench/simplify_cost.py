"""What onnxslim costs in the export stage, with its own shape inference after every round against the export
stage's way (shapes inferred once beforehand by ONNX Runtime's symbolic inference, onnxslim told not to infer
them again), on the side-by-side projects' real models (bench/build_times.py), and whether the graphs match.

Each model is built FP32 for cpu with ``export.simplify = false`` (its unsimplified ``model.onnx``), then both
ways are timed on it, best of ``--rounds``, in this process.

    PYTHONPATH=$PWD .venv/bin/python bench/simplify_cost.py [--rounds 3] [--json bench/simplify_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _unsimplified(config: Path, out: Path, cache: Path) -> Path:
    """``model.onnx`` of a cold FP32 cpu build of ``config`` with simplification off."""
    env = {**os.environ, "EDGEDEPLOY_CACHE_DIR": str(cache)}
    argv = [sys.executable, "-m", "edgedeploy", "build", "--config", str(config), "--target", "cpu",
            "--out", str(out), "--no-simplify", "-q"]  # fmt: skip
    subprocess.run(argv, check=True, cwd=config.parent, env=env, capture_output=True, timeout=1800)
    return out / "model.onnx"


def _timed(fn, model, rounds: int):
    import onnx

    best, result = float("inf"), None
    for _ in range(rounds):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        start = time.perf_counter()
        result = fn(copy)
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> int:
    import onnx
    import onnxslim
    from build_times import compile_bytecode, side_by_side_projects

    from edgedeploy.onnxtools.simplify import with_inferred_shapes

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    compile_bytecode()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, project in side_by_side_projects(Path(tmp)).items():
            path = _unsimplified(project["config"], Path(tmp) / f"out_{name}", Path(tmp) / "cache")
            model = onnx.load(str(path))
            own_s, own = _timed(lambda m: onnxslim.slim(m), model, args.rounds)
            once_s, once = _timed(lambda m: onnxslim.slim(with_inferred_shapes(m), no_shape_infer=True), model,
                                  args.rounds)  # fmt: skip
            row = {
                "model": name,
                "nodes_exported": len(model.graph.node),
                "onnxslim_own_inference_s": round(own_s, 2),
                "inferred_once_s": round(once_s, 2),
                "nodes_after": [len(own.graph.node), len(once.graph.node)],
                "same_ops": [n.op_type for n in own.graph.node] == [n.op_type for n in once.graph.node],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    doc = {
        "command": "PYTHONPATH=$PWD python bench/simplify_cost.py " + " ".join(sys.argv[1:]),
        "load_avg_1min": round(os.getloadavg()[0], 1),
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
