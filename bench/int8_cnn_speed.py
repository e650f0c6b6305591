"""Speed of EfficientNet-Lite0 INT8 models against their FP32 model, side by side in one run.

The models are files other runs made (``bench/int8_cnn.py --workdir``'s builds and all-INT8 variants, or a
``deploy build`` with other settings); each is timed as ``bench/int8_cnn.py`` times its models: ONNX Runtime,
batch 1, one thread, the models round-robin for ``--rounds`` rounds of ``--iters`` runs on held-out crops, each
speed-up taken within a round, the median over rounds.

    PYTHONPATH=$PWD .venv/bin/python bench/int8_cnn_speed.py --fp32 OUT/model.onnx \\
        build=OUT/model.int8.onnx adaround=OUT_ADA/model.int8.onnx [--json bench/int8_cnn_speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    import int8_cnn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fp32", type=Path, required=True)
    ap.add_argument("models", nargs="+", help="NAME=PATH of each INT8 model")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    pics = int8_cnn.photos()
    held = int8_cnn.to_input(int8_cnn.crops([pics[n] for n in int8_cnn.HELDOUT_PHOTOS], 50, seed=1))
    paths = {"fp32": args.fp32, **{m.split("=", 1)[0]: Path(m.split("=", 1)[1]) for m in args.models}}
    load_before = os.getloadavg()[0]
    timed = int8_cnn.latency({k: int8_cnn.session(p) for k, p in paths.items()}, held, args.rounds, args.iters)
    result = {
        "command": " ".join(sys.argv),
        "models": {k: str(p) for k, p in paths.items()},
        "latency_batch1_one_thread": timed,
        "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    for name, row in timed.items():
        print(f"{name:28s} {row['p50_ms_median']:7.3f} ms  {row['speedup_vs_fp32_median']:.2f}x FP32", flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
