"""EfficientNet-Lite0 INT8 for jetson-orin: the Q/DQ placement TensorRT gets, its accuracy, and the bundle's dry run.

``deploy build --target jetson-orin --precision int8 --calib photos/`` on the real ImageNet weights
(bench/int8_cnn.py's project: 64 calibration crops of 9 photos), then:

- the placement of the shipped ``model.int8.onnx`` checked against NVIDIA's recommendations
  (``edgedeploy.precision.qdq_placement.placement_findings``: Q/DQ on conv->activation edges, residual Adds with
  both inputs quantized, residual Adds with no quantized input) and counted (Q/DQ pairs, residual Adds);
- top-1 agreement of that model with the float model in ONNX Runtime on 64 held-out crops of 9 other photos;
- the bundle's device step with the ONNX Runtime stand-in (``complete_bundle.py --runner onnxruntime``).

Needs the ``bench`` extra. No TensorRT here: engine speed on an Orin is not measured.

    PYTHONPATH=$PWD .venv/bin/python bench/orin_qdq_lite0.py [--json bench/orin_qdq_lite0.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    import int8_cnn
    import onnx
    from build_times import _top1_agreement

    from edgedeploy.precision.qdq_placement import placement_findings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    pics = int8_cnn.photos()
    calib_crops, _ = int8_cnn.stage_calibration(pics)
    held = int8_cnn.to_input(int8_cnn.crops([pics[n] for n in int8_cnn.HELDOUT_PHOTOS], 64, seed=1))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cfg = int8_cnn.write_project(work / "project", calib_crops)
        load = os.getloadavg()[0]
        row = int8_cnn.deploy_build(cfg, "jetson-orin", work / "out")
        row["load_avg_1min"] = round(load, 1)
        int8 = work / "out" / "model.int8.onnx"
        if row["status"] == "passed":
            model = onnx.load(str(int8))
            ops = [n.op_type for n in model.graph.node]
            kept = [k["node"] for k in json.loads((work / "out" / "precision.json").read_text())["kept_float"]]
            row["placement_findings"] = placement_findings(model, kept)  # a kept-float Add reads float inputs
            row["graph"] = {
                "quantize_linear": ops.count("QuantizeLinear"),
                "adds": ops.count("Add"),
                "convs": ops.count("Conv"),
            }
            info = json.loads((work / "out" / "precision.json").read_text())
            row["qdq_placement"] = info.get("qdq_placement")
            row["fallback_start"] = info.get("fallback_start")
            row["fallback_stop"] = info.get("fallback_stop")
            row["calib_cache_written"] = (work / "out" / "calib.cache").exists()
            row["plan_strategy"] = json.loads((work / "out" / "bundle" / "plan.json").read_text())["strategy"]
            row["heldout_top1_agreement_onnxruntime"] = _top1_agreement(work / "out" / "model.onnx", int8, held)
            row["dry_run"] = int8_cnn.dry_run(work / "out" / "bundle")
    row["command"] = "PYTHONPATH=$PWD python bench/orin_qdq_lite0.py --json bench/orin_qdq_lite0.json"
    print(json.dumps(row, indent=2, default=str))
    if args.json:
        args.json.write_text(json.dumps(row, indent=2, default=str) + "\n")
    return 0 if row["status"] == "passed" else 1


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    raise SystemExit(main())
