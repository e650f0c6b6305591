"""The INT8 search's node ranking with the float weights shared by its one-node models, against copied into each.

Where the ranking quantizes each node alone (TensorRT targets, and rung c on cpu), each one-node model holds
every other node's float weights. They are written once, to one file beside those models, and referenced
(``edgedeploy/precision/shared_weights.py``), where each model copied and wrote them. The model runs the same
bytes either way, so the ranking, the tries and the float set shipped are the same.

Model: the ResNet-50 embedder of ``bench/int8_resnet.py`` (real weights, about 100 MB of float weights, 87
quantized nodes), built for jetson-orin at ``precision.accuracy_target = 0.998`` (host stages), twice, each build
in its own process with an empty stage cache, one after the other: as shipped, and with the weights copied into
each one-node model. Recorded per build: wall seconds (process start included), the ranking's seconds, the
tries and the float set shipped.

About 7 minutes on 2 cores.

    PYTHONPATH=$PWD .venv/bin/python bench/int8_ranking_weights.py [--json bench/int8_ranking_weights.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

MODEL, TARGET, ACCURACY_TARGET = "resnet50_embedding", "jetson-orin", 0.998
MODES = ("shipped", "weights_copied")


def child(cfg: Path, out: Path, mode: str) -> int:
    """One build in this process; the ranking's seconds written beside ``out``."""
    import edgedeploy.precision.fallback as fallback
    from edgedeploy.api import build
    from edgedeploy.errors import DeployError
    from edgedeploy.precision.quantize import Quantizer

    if mode == "weights_copied":
        Quantizer._reference_float_weights = lambda self, out: None  # type: ignore[method-assign]
    ranking = fallback.layer_sensitivity
    spent: list[float] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return ranking(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t0)

    fallback.layer_sensitivity = timed
    sys.path.insert(0, str(cfg.parent))
    try:
        build(cfg, build__target=TARGET, build__out=str(out), precision__mode="int8",
              precision__calib=str(cfg.parent / "photos"), precision__accuracy_target=ACCURACY_TARGET)  # fmt: skip
    except DeployError as exc:
        print(exc.one_line(), file=sys.stderr)
        return 1
    (out.parent / f"{out.name}.ranking.json").write_text(json.dumps({"seconds": round(sum(spent), 1)}))
    return 0


def one_build(cfg: Path, work: Path, mode: str) -> dict[str, Any]:
    from int8_search_start import run_child, search_summary

    out = work / f"out-{mode}"
    env = {**os.environ, "EDGEDEPLOY_CACHE_DIR": str(work / f"cache-{mode}")}
    argv = [sys.executable, __file__, "--child", str(cfg), str(out), mode]
    row: dict[str, Any] = {"mode": mode}
    plan = run_child(argv, env, out, row)
    if plan is not None:
        row["ranking_s"] = json.loads((work / f"{out.name}.ranking.json").read_text())["seconds"]
        row.update(search_summary(plan, ("family", "float_nodes")))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", nargs=3, metavar=("CONFIG", "OUT", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        cfg, out, mode = args.child
        return child(Path(cfg), Path(out), mode)
    from int8_search_start import finish, print_case, write_project

    work = Path(tempfile.mkdtemp(prefix="int8-ranking-weights-"))
    cfg = write_project(MODEL, work / "projects")
    builds = [one_build(cfg, work, mode) for mode in MODES]
    new, old = builds
    case = {
        "builds": builds,
        "same_tries_and_shipped": "shipped" in new
        and new.get("shipped") == old.get("shipped")
        and new.get("tries") == old.get("tries"),
        "seconds_ratio_shipped_over_weights_copied": round(new["seconds"] / old["seconds"], 2),
    }
    print_case(MODEL, case)
    command = "PYTHONPATH=$PWD python bench/int8_ranking_weights.py --json bench/int8_ranking_weights.json"
    result = {"target": TARGET, "accuracy_target": ACCURACY_TARGET, "cores": os.cpu_count(), "command": command}
    return finish({**result, "cases": {MODEL: case}}, args.json, {MODEL: case})


if __name__ == "__main__":
    raise SystemExit(main())
