"""Where the ranked INT8 search starts: at the size its ranking predicts, against sizes from 1, on real weights.

For a TensorRT target the INT8 search ranks every quantized node by what quantizing it alone costs at the model
outputs, then tries float sets of doubling size until one passes and bisects. The sizes start where the ranking says
the all-INT8 miss is removed (``edgedeploy.precision.fallback.predicted_first_size``). Here each model is built for
``jetson-orin`` (host stages; no TensorRT needed) twice: as shipped, and with that prediction turned off, so the
sizes start at 1. Each build runs in its own process with an empty stage cache, one after the other (the predicted
start first). Recorded per build: the fallback tries (family, float nodes, score), the float set shipped and its
score, the predicted start, and the build's wall seconds (process start included, as a ``deploy build``'s).

Models:

- ``efficientnet_lite0``: EfficientNet-Lite0 with its ImageNet weights, ``bench/int8_cnn.py``'s project. It is
  judged by top-1 agreement at the default target of 0.95.
- ``resnet50_embedding``: the imgsim ResNet-50 embedding model, ``bench/int8_resnet.py``'s project, judged by
  cosine similarity. ``precision.accuracy_target`` is 0.998 here: at the default 0.99 its all-INT8 model passes
  and nothing is searched.

Needs the ``bench`` extra (imgsim included). About 15 minutes on 2 cores.

    PYTHONPATH=$PWD .venv/bin/python bench/int8_search_start.py [--json bench/int8_search_start.json]
        [--models NAME ...]
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
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

TARGET = "jetson-orin"
SETTINGS: dict[str, dict[str, Any]] = {
    "efficientnet_lite0": {},
    "resnet50_embedding": {"precision__accuracy_target": 0.998},
}


def write_project(name: str, folder: Path) -> Path:
    """The model's bench project (64 calibration crops of 9 photos), written under ``folder``."""
    import int8_cnn

    pics = int8_cnn.photos()
    if name == "efficientnet_lite0":
        calib_crops, _ = int8_cnn.stage_calibration(pics)
        return int8_cnn.write_project(folder / name, calib_crops)
    import int8_resnet

    calib_crops = int8_cnn.crops([pics[n] for n in int8_cnn.CALIB_PHOTOS], 64, seed=0)
    return int8_resnet.write_project(folder / name, calib_crops)


def child(cfg: Path, out: Path, start: str, settings: dict[str, Any]) -> int:
    """One build in this process; ``start`` = ``one`` turns the prediction off (sizes from 1)."""
    from edgedeploy.api import build
    from edgedeploy.errors import DeployError

    if start == "one":
        import edgedeploy.precision.fallback as fallback

        fallback.predicted_first_size = lambda *_args: {"size": 1, "predicted": None, "why": "turned off"}
    sys.path.insert(0, str(cfg.parent))
    try:
        build(cfg, build__target=TARGET, build__out=str(out), precision__mode="int8",
              precision__calib=str(cfg.parent / "photos"), **settings)  # fmt: skip
    except DeployError as exc:
        print(exc.one_line(), file=sys.stderr)
        return 1
    return 0


def one_build(name: str, cfg: Path, work: Path, start: str, turn: int) -> dict[str, Any]:
    out = work / f"out-{name}-{start}-{turn}"
    env = {**os.environ, "EDGEDEPLOY_CACHE_DIR": str(work / f"cache-{name}-{start}-{turn}")}
    argv = [sys.executable, __file__, "--child", str(cfg), str(out), start, json.dumps(SETTINGS[name])]
    row: dict[str, Any] = {"start": "predicted" if start == "predicted" else "from 1"}
    plan = run_child(argv, env, out, row)
    if plan is not None:
        row.update(search_summary(plan, ("family", "float_nodes")))
    return row


def run_child(argv: list[str], env: dict[str, str], out: Path, row: dict[str, Any]) -> dict[str, Any] | None:
    """Run one build's child process, adding its exit code, wall seconds and the load average before and after
    to ``row``; the build's ``precision.json`` under ``out``, or None (``row["error"]``: its last stderr line)."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    row.update(exit_code=proc.returncode, seconds=round(seconds, 1))
    row["load_avg_1min"] = [round(load, 1), round(os.getloadavg()[0], 1)]
    plan_file = out / "precision.json"
    if proc.returncode != 0 or not plan_file.is_file():
        row["error"] = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None
    return json.loads(plan_file.read_text())


def print_case(label: str, case: dict[str, Any]) -> None:
    """One progress line per compared case: its figures but the builds."""
    print(label, json.dumps({k: v for k, v in case.items() if k != "builds"}), flush=True)


def search_summary(plan: dict[str, Any], try_keys: tuple[str, ...]) -> dict[str, Any]:
    """A build's INT8 search from its ``precision.json``: the predicted start, each try's ``try_keys`` (the last
    one: the float set's size), score and verdict, the float set shipped (under that last key) and its score,
    and why the search stopped."""
    size = try_keys[-1]
    return {
        "fallback_start": plan.get("fallback_start"),
        "tries": [
            {**{k: t.get(k) for k in try_keys}, "score": round(t["score"], 5), "met": t["met"]}
            for t in plan["fallback_tries"]
        ],
        "fallback_tries": len(plan["fallback_tries"]) - 1,
        "shipped": {
            size: sorted(k["node"] for k in plan["kept_float"]),
            "metric": plan["accuracy"]["metric"],
            "score": round(plan["accuracy"]["score"], 5),
        },
        "fallback_stop": plan.get("fallback_stop"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--models", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--child", nargs=4, metavar=("CONFIG", "OUT", "START", "SETTINGS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        cfg, out, start, settings = args.child
        return child(Path(cfg), Path(out), start, json.loads(settings))
    work = Path(tempfile.mkdtemp(prefix="int8-search-start-"))
    rows: dict[str, Any] = {}
    for name in args.models:
        cfg = write_project(name, work / "projects")
        builds = [one_build(name, cfg, work, start, 0) for start in ("predicted", "one")]
        new, old = builds
        same = "shipped" in new and "shipped" in old and new["shipped"] == old["shipped"]
        rows[name] = {
            "settings": SETTINGS[name],
            "builds": builds,
            "same_float_set_and_score": same,
            "seconds_ratio_predicted_over_from_1": round(new["seconds"] / old["seconds"], 2),
        }
        print_case(name, rows[name])
    result = {
        "target": TARGET,
        "cores": os.cpu_count(),
        "models": rows,
        "command": "PYTHONPATH=$PWD python bench/int8_search_start.py --json bench/int8_search_start.json",
    }
    return finish(result, args.json, rows)


def finish(result: dict[str, Any], path: Path | None, groups: dict[str, Any]) -> int:
    """Print ``result`` and write it to ``path`` when given; 0 when every build in ``groups`` exited 0."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        path.write_text(text + "\n")
    ok = all(b.get("exit_code") == 0 for r in groups.values() for b in r["builds"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
