"""Where a cold ``deploy build`` spends its time: per stage, and the functions under cProfile.

Each model of bench/build_times.py's zoo (or the ones named) is built cold (empty stage cache) in this
process under cProfile; the stage table, wall and process CPU seconds, and the most expensive functions by
cumulative time (library internals folded into the edgedeploy / torch / onnx call that reached them) are
printed and written as JSON. Imports are profiled too: the first model pays for them, as a user's first build
does. ``efficientnet_lite0`` and ``minilm_l6`` name the real-weight projects of the side-by-side run (the
``bench`` extra). PyTorch's OpenMP threads wait as in a ``deploy build`` process (a short spin, unless
``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is set: ``OMP_WAIT_POLICY=ACTIVE`` profiles the spinning default).

    PYTHONPATH=$PWD .venv/bin/python bench/profile_build.py [--json bench/profile_build.json] [--top 25] [name ...]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

INTERESTING = ("edgedeploy/", "torch/onnx/", "torch/export/", "torch/jit/", "onnxslim", "onnxruntime/", "onnx/")


def top_functions(profile: cProfile.Profile, top: int) -> list[dict]:
    """The ``top`` functions by cumulative seconds among edgedeploy's and the exporters' / runtimes' own."""
    stats = pstats.Stats(profile)
    rows = []
    for (file, line, func), (_cc, calls, _tt, cum, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if any(part in file for part in INTERESTING):
            short = file.split("site-packages/")[-1].split("/edgedeploy/")[-1]
            rows.append({"function": f"{short}:{line}({func})", "calls": calls, "cumulative_s": round(cum, 2)})
    rows.sort(key=lambda r: -r["cumulative_s"])
    return rows[:top]


def main() -> int:
    from edgedeploy.pipeline.threads import bounded_blas_waits, bounded_thread_waits

    policy = bounded_thread_waits()  # before anything below imports torch, as a build's process does
    blas = bounded_blas_waits()  # and numpy, as the deploy command does
    from build_times import _toml, side_by_side_projects, zoo

    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    doc: dict = {
        "command": "PYTHONPATH=$PWD python bench/profile_build.py " + " ".join(sys.argv[1:]),
        "cores": os.cpu_count(),
        "omp_wait_policy": policy,
        "blas_waits": blas,
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        models = zoo(folder)
        real = {"efficientnet_lite0", "minilm_l6"} & set(args.names)
        projects = side_by_side_projects(folder) if real else {}
        for name in args.names or list(models):
            if name in real:
                config = projects[name]["config"]
                os.chdir(config.parent)  # the project's relative paths (checkpoint, model code)
            else:
                config = folder / f"{name}.toml"
                config.write_text(_toml(models[name], folder / f"out_{name}"))
            os.environ["EDGEDEPLOY_CACHE_DIR"] = str(folder / f"cache_{name}")
            load = os.getloadavg()[0]
            profile = cProfile.Profile()
            t0, cpu0 = time.perf_counter(), time.process_time()
            profile.enable()
            try:
                from edgedeploy.api import build

                result = build(config, log=lambda _line: None, build__out=str(folder / f"out_{name}"))
                stages = {s.name: round(s.seconds, 2) for s in result.stages}
                export = result.report["metrics"].get("export", {})
                error = None
            except Exception as exc:  # a failing model is reported, the others still run
                stages, export, error = {}, {}, f"{type(exc).__name__}: {exc}"[:300]
            finally:
                profile.disable()
            row = {
                "model": name,
                "wall_s": round(time.perf_counter() - t0, 2),
                "cpu_s": round(time.process_time() - cpu0, 2),
                "load_avg_1min": round(load, 1),
                "stages_s": stages,
                "exporter": export.get("exporter"),
                "error": error,
                "top": top_functions(profile, args.top),
            }
            doc["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "top"}), flush=True)
            for r in row["top"][:12]:
                print(f"    {r['cumulative_s']:8.2f}s {r['calls']:6d}  {r['function']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(r["error"] is None for r in doc["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
