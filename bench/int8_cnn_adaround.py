"""Learned weight rounding (AdaRound) on EfficientNet-Lite0 INT8, judged on real photos never calibrated on.

Same model, photos and split as ``bench/int8_cnn.py``; every variant calibrates on the precision stage's share
of the 64 calibration crops (the first 48; the stage holds the last 16 out) and is scored against the FP32 ONNX
model on 270 crops of 9 other photos and 270 fresh crops of the calibration photos. Variants (all every layer
INT8, edgedeploy's quantizer with the cpu flavour, 8-bit per-channel weights, layer-by-layer output bias
correction as the precision stage's default):

- ``nearest``: ORT's round-to-nearest weights (today's best all-INT8 model);
- ``adaround_float_inputs``: rounding learned to reconstruct each layer's float output from its float input;
- ``adaround_quantized_inputs``: ... from its input in the nearest-rounded QDQ model (upstream error included);
- ``adaround_sequential[_N]``: the same, N layers at a time in graph order (default 4), each step's inputs taken
  from the QDQ model with the layers before it already rounded;
- ``adaround_mix<P>[_sequential]``: reconstruct from ``P % x~ + (100 - P) % x`` (at once, or sequential);
- ``weights_only_nearest`` / ``weights_only_adaround``: activations float, only the weights on the INT8 grid
  (nearest, or AdaRound from float inputs): the weight rounding error alone.

Also ONNX Runtime CPU latency of each vs FP32 (batch 1, one thread, interleaved rounds) and the seconds the
rounding took. Usage: ``python bench/int8_cnn_adaround.py --json bench/int8_cnn_adaround.json``
(``--fp32 model.onnx`` reuses an exported FP32 model; else a cpu FP32 build exports it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import int8_cnn as base


def weights_only(float_model: Path, out: Path, codes) -> Path:
    """``float_model`` with every Conv/Gemm weight replaced by ``scale * code`` (nearest codes when ``codes`` is
    None): weight rounding error only, activations float."""
    import onnx
    from onnx import numpy_helper as nh

    from edgedeploy.precision.adaround import weight_scales, weighted_layers

    model = onnx.load(str(float_model))
    inits = {i.name: i for i in model.graph.initializer}
    for layer in weighted_layers(model):
        w = layer.rows(nh.to_array(inits[layer.weight]).astype(np.float32))
        scale = weight_scales(w.reshape(-1, w.shape[-1])).reshape(w.shape[0], w.shape[1], 1)
        q = np.clip(np.round(w / scale), -127, 127) if codes is None else layer.rows(codes.codes[layer.weight])
        inits[layer.weight].CopyFrom(nh.from_array(layer.unrows(q * scale).astype(np.float32), layer.weight))
    onnx.save(model, str(out))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--fp32", type=Path, help="the exported FP32 model.onnx (default: build it)")
    ap.add_argument("--heldout-crops", type=int, default=270)
    ap.add_argument("--iters", type=int, default=300, help="AdaRound steps per layer")
    ap.add_argument("--variants", default="nearest,adaround_float_inputs,adaround_quantized_inputs,adaround_sequential")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument(
        "--deploy-build",
        metavar="TARGET",
        help="only run `deploy build --target TARGET --precision int8 --calib photos/` (the default "
        "precision.weight_rounding) as bench/int8_cnn.py does, and report it",
    )
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    from edgedeploy.precision.adaround import learn_rounding
    from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess

    pics = base.photos()
    calib_crops, calib = base.stage_calibration(pics)
    held = base.to_input(base.crops([pics[n] for n in base.HELDOUT_PHOTOS], args.heldout_crops, seed=1))
    fresh = base.to_input(base.crops([pics[n] for n in base.CALIB_PHOTOS], args.heldout_crops, seed=2))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="int8-adaround-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.deploy_build:
        cfg = base.write_project(work / "project", calib_crops)
        sys.path.insert(0, str(cfg.parent))
        row = base.deploy_build(cfg, args.deploy_build, work / f"out-{args.deploy_build}")
        info = work / f"out-{args.deploy_build}" / "precision.json"
        if info.is_file():
            row["weight_rounding"] = json.loads(info.read_text()).get("weight_rounding")
        base.emit({"deploy_build": {args.deploy_build: row}}, args.json)
        return 0
    fp32 = args.fp32
    if fp32 is None:
        from edgedeploy.api import build

        cfg = base.write_project(work / "project", calib_crops)
        sys.path.insert(0, str(cfg.parent))
        build(cfg, log=lambda _: None, build__target="cpu", build__out=str(work / "out-cpu"))
        fp32 = work / "out-cpu" / "model.onnx"
    pre = preprocess(fp32, work / "float.onnx")  # BN folded, as the precision stage quantizes it
    flavour = flavour_for("onnxruntime")

    def quantizer(name: str) -> Quantizer:
        d = work / name
        d.mkdir(exist_ok=True)
        return Quantizer(pre, d, flavour, reduce_range=False)

    naive = quantizer("naive").quantize(work / "naive.onnx", calib)
    wanted = args.variants.split(",")
    paths: dict[str, Path] = {}
    rounding: dict[str, dict] = {}
    for name in wanted:
        q = quantizer(name)
        q.output_bias_correction = True
        t0 = time.perf_counter()
        if name == "adaround_float_inputs":
            q.weight_codes = learn_rounding(pre, calib, iters=args.iters)
        elif name == "adaround_quantized_inputs":
            q.weight_codes = learn_rounding(pre, calib, quantized_model=naive, iters=args.iters)
        elif name.startswith("adaround_sequential"):  # adaround_sequential[_<layers per step>], default 4
            step = int(name.rsplit("_", 1)[1]) if name[-1].isdigit() else 4
            q.weight_codes = learn_rounding(pre, calib, quantized_model=naive, sequential=step, iters=args.iters)
        elif name.startswith("adaround_mix"):  # adaround_mix<percent>[_sequential]: from mix x~ + (1 - mix) x
            mix = int(name.split("_")[1][3:]) / 100
            step = 4 if name.endswith("_sequential") else 0
            q.weight_codes = learn_rounding(
                pre, calib, quantized_model=naive, sequential=step, mix=mix, iters=args.iters
            )
        elif name == "weights_only_adaround":
            q.weight_codes = learn_rounding(pre, calib, iters=args.iters)
        elif name not in ("nearest", "weights_only_nearest"):
            raise SystemExit(f"unknown variant {name}")
        learn_s = time.perf_counter() - t0
        if name.startswith("weights_only"):  # float activations, the weights on the INT8 grid (as float values)
            paths[name] = weights_only(pre, work / f"{name}.onnx", q.weight_codes)
        else:
            paths[name] = q.quantize(work / f"{name}.onnx", calib)
        if q.weight_codes is not None:
            layers = q.weight_codes.layers
            rounding[name] = {
                "seconds": round(learn_s, 1),
                "layers_learned": sum(r["learned"] for r in layers),
                "layers": len(layers),
                "mean_output_error_nearest": round(float(np.mean([r["error_nearest"] for r in layers])), 5),
                "mean_output_error_learned": round(float(np.mean([r["error_learned"] for r in layers])), 5),
                "per_layer": layers,
            }
        print(name, "built", rounding.get(name, {}).get("seconds"), flush=True)
    sessions = {"fp32": base.session(pre), **{k: base.session(v) for k, v in paths.items()}}
    agreement = base.agreement(sessions, held, fresh, paths)
    lat = base.latency(sessions, held, rounds=5, iters=15)
    result = {
        "agreement_top1_vs_fp32": agreement,
        "speed_vs_fp32": {k: round(lat[k]["speedup_vs_fp32_median"], 2) for k in paths},
        "p50_ms": {k: round(v["p50_ms_median"], 2) for k, v in lat.items()},
        "rounding": rounding,
        "setup": {
            "calibration": "the first 48 of 64 crops of the calibration photos (seed 0): the stage's calibrated share",
            "heldout": f"{args.heldout_crops} crops of {', '.join(base.HELDOUT_PHOTOS)} (seed 1), and "
            f"{args.heldout_crops} fresh crops (seed 2) of the calibration photos",
            "adaround_iters": args.iters,
            "load_average": list(os.getloadavg()),
        },
    }
    base.emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
