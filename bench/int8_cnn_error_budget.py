"""Where EfficientNet-Lite0's INT8 error comes from: weights vs activations, one layer vs all, and what helps.

Same model, photos and split as ``bench/int8_cnn.py`` (calibration: the 48 crops the precision stage calibrates
on, i.e. 64 crops of the calibration photos minus its 25 % held-out share; judged on crops of 9 other photos
never calibrated on). Every variant is scored against the FP32 ONNX model on the held-out crops: top-1 agreement
and the logits' signal-to-noise ratio (SNR, dB: ||fp32||^2 / ||int8 - fp32||^2). Variants:

- weights only (activations float): per-channel symmetric 8-bit weights rounded to nearest; the same with the
  depthwise convs' weights rounded by GPTQ (Frantar et al. 2022: column by column, each rounding error
  compensated in the not-yet-rounded weights through the inverse Hessian of the layer's calibration inputs);
  and the five single layers whose weight rounding alone costs the most;
- activations only (weights float): edgedeploy's QDQ model with each weight's DequantizeLinear replaced by the
  float weight;
- everything INT8 (edgedeploy's quantizer, cpu flavour, 8-bit per-channel weights): plain, with bias correction,
  with GPTQ depthwise weights + bias correction, with the first depthwise conv kept float, with every
  depthwise conv kept float; ONNX Runtime CPU latency of each vs FP32 (batch 1, one thread, interleaved rounds).

Usage: ``python bench/int8_cnn_error_budget.py --json bench/int8_cnn_error_budget.json`` (about 5 minutes on
2 cores; ``pip install 'edgedeploy[bench]'``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import int8_cnn as base


def run(sess, x: np.ndarray) -> np.ndarray:
    return np.concatenate([sess.run(None, {"image": x[i : i + 1]})[0] for i in range(len(x))])


def score(logits: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    snr = 10 * np.log10((ref**2).sum() / max(((logits - ref) ** 2).sum(), 1e-30))
    return {
        "top1_agreement": round(float((logits.argmax(1) == ref.argmax(1)).mean()), 4),
        "snr_db": round(float(snr), 2),
    }


def group(node) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1)


def depthwise_hessians(model_path: Path, calib: np.ndarray, positions: int = 1024) -> dict[str, np.ndarray]:
    """Depthwise conv name -> per-channel (k*k, k*k) second moment of its input patches on ``calib``."""
    import onnx
    from numpy.lib.stride_tricks import sliding_window_view
    from onnx import helper

    model = onnx.load(str(model_path))
    dws = [n for n in model.graph.node if n.op_type == "Conv" and group(n) > 1]
    have = {o.name for o in model.graph.output}
    for n in dws:
        if n.input[0] not in have:
            model.graph.output.append(helper.make_tensor_value_info(n.input[0], onnx.TensorProto.FLOAT, None))
            have.add(n.input[0])
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    weights = {i.name: i.dims for i in model.graph.initializer}
    rng = np.random.default_rng(0)
    hess: dict[str, np.ndarray] = {}
    for b in range(len(calib)):
        outs = dict(zip(names, sess.run(None, {"image": calib[b : b + 1]})))
        for n in dws:
            k = int(weights[n.input[1]][-1])
            attrs = {a.name: list(a.ints) for a in n.attribute}
            stride, pads = attrs.get("strides", [1, 1])[0], attrs.get("pads", [0, 0, 0, 0])
            x = np.pad(outs[n.input[0]][0], ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
            win = sliding_window_view(x, (k, k), axis=(1, 2))[:, ::stride, ::stride]
            p = win.reshape(x.shape[0], -1, k * k)
            pick = rng.choice(p.shape[1], min(p.shape[1], positions), replace=False)
            p = p[:, pick].astype(np.float64)
            hess[n.name] = hess.get(n.name, 0) + np.einsum("cpi,cpj->cij", p, p)
    return hess


def gptq_row(w: np.ndarray, hess: np.ndarray, scale: float, damp: float = 0.01) -> np.ndarray:
    """Integer codes of one weight row, rounded column by column with error compensation (GPTQ)."""
    w = w.astype(np.float64).copy()
    h = hess.copy()
    dead = np.diag(h) == 0
    h[dead, dead] = 1
    w[dead] = 0
    h += damp * np.mean(np.diag(h)) * np.eye(len(w))
    u = np.linalg.cholesky(np.linalg.inv(h)).T
    q = np.zeros(len(w), np.int64)
    for i in range(len(w)):
        q[i] = int(np.clip(np.round(w[i] / scale), -127, 127))
        w[i + 1 :] -= (w[i] - q[i] * scale) / u[i, i] * u[i, i + 1 :]
    return q


def weights_only(model_path: Path, hess: dict[str, np.ndarray] | None = None, only: str | None = None):
    """The float model with per-channel 8-bit weights (GPTQ for depthwise convs when ``hess``; ``only``: one node)."""
    import onnx
    from onnx import numpy_helper as nh

    model = onnx.load(str(model_path))
    inits = {i.name: i for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type not in ("Conv", "Gemm") or n.input[1] not in inits or (only and n.name != only):
            continue
        w = nh.to_array(inits[n.input[1]]).astype(np.float64)
        rows = w.reshape(w.shape[0], -1)
        scale = np.abs(rows).max(1) / 127
        scale[scale == 0] = 1
        if hess is not None and n.name in hess:
            codes = np.stack([gptq_row(rows[c], hess[n.name][c], scale[c]) for c in range(len(rows))])
        else:
            codes = np.clip(np.round(rows / scale[:, None]), -127, 127)
        inits[n.input[1]].CopyFrom(
            nh.from_array((codes * scale[:, None]).reshape(w.shape).astype(np.float32), n.input[1])
        )
    return model


def gptq_into_qdq(qdq_path: Path, float_path: Path, hess: dict[str, np.ndarray]) -> None:
    """Rewrite the int8 weight codes of the QDQ model's depthwise convs with GPTQ's (same scales)."""
    import onnx
    from onnx import numpy_helper as nh

    model = onnx.load(str(qdq_path))
    floats = {i.name: nh.to_array(i) for i in onnx.load(str(float_path)).graph.initializer}
    float_w = {n.name: n.input[1] for n in onnx.load(str(float_path)).graph.node if n.op_type == "Conv"}
    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    for n in model.graph.node:
        dq = producers.get(n.input[1]) if n.op_type == "Conv" and n.name in hess else None
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue
        codes = nh.to_array(inits[dq.input[0]])
        scale = np.broadcast_to(nh.to_array(inits[dq.input[1]]).astype(np.float64), (codes.shape[0],))
        rows = floats[float_w[n.name]].reshape(codes.shape[0], -1)
        new = np.stack([gptq_row(rows[c], hess[n.name][c], scale[c]) for c in range(len(rows))])
        inits[dq.input[0]].CopyFrom(nh.from_array(new.reshape(codes.shape).astype(codes.dtype), dq.input[0]))
    onnx.save(model, str(qdq_path))


def activations_only(qdq_path: Path, float_path: Path):
    """The QDQ model with every weight DequantizeLinear replaced by the float weight."""
    import onnx
    from onnx import numpy_helper as nh

    model = onnx.load(str(qdq_path))
    floats = {n.name: n.input[1] for n in onnx.load(str(float_path)).graph.node if n.op_type in ("Conv", "Gemm")}
    float_inits = {i.name: i for i in onnx.load(str(float_path)).graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    drop = set()
    for n in model.graph.node:
        dq = producers.get(n.input[1]) if n.op_type in ("Conv", "Gemm") and len(n.input) > 1 else None
        if dq is not None and dq.op_type == "DequantizeLinear" and n.name in floats:
            name = f"{n.name}__float_w"
            model.graph.initializer.append(nh.from_array(nh.to_array(float_inits[floats[n.name]]), name))
            n.input[1] = name
            drop.add(id(dq))
    keep = [n for n in model.graph.node if id(n) not in drop]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--heldout-crops", type=int, default=135)
    ap.add_argument("--workdir", type=Path, help="reuse int8_cnn.py's --workdir (its FP32 export)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import onnxruntime as ort

    from edgedeploy.precision import equalize
    from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess

    pics = base.photos()
    calib = base.to_input(base.crops([pics[n] for n in base.CALIB_PHOTOS], 64, seed=0))[:48]
    held = base.to_input(base.crops([pics[n] for n in base.HELDOUT_PHOTOS], args.heldout_crops, seed=1))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="int8-budget-"))
    fp32 = next(iter(sorted((work / "out-cpu").glob("**/model.onnx"))), None) if (work / "out-cpu").is_dir() else None
    if fp32 is None:
        from edgedeploy.api import build

        cfg = base.write_project(work / "project", base.crops([pics[n] for n in base.CALIB_PHOTOS], 64, seed=0))
        sys.path.insert(0, str(cfg.parent))
        build(cfg, log=lambda _: None, build__target="cpu", build__out=str(work / "out-cpu"))
        fp32 = work / "out-cpu" / "model.onnx"
    budget = work / "budget"
    budget.mkdir(parents=True, exist_ok=True)
    pre = preprocess(fp32, budget / "float.onnx")  # BN folded, as the precision stage quantizes it
    opts = ort.SessionOptions()
    opts.log_severity_level = 3

    def from_model(model) -> np.ndarray:
        return run(ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]), held)

    ref = run(base.session(pre), held)
    hess = depthwise_hessians(pre, calib)
    batches = [{"image": calib[i : i + 1]} for i in range(len(calib))]
    means = equalize.conv_input_means(pre, batches)
    result: dict[str, object] = {}
    result["weights_only_nearest"] = score(from_model(weights_only(pre)), ref)
    result["weights_only_gptq_depthwise"] = score(from_model(weights_only(pre, hess)), ref)
    import onnx

    convs = [n.name for n in onnx.load(str(pre)).graph.node if n.op_type in ("Conv", "Gemm")]
    single = sorted(
        ({"node": c, **score(from_model(weights_only(pre, only=c)), ref)} for c in convs), key=lambda r: r["snr_db"]
    )
    result["weights_only_single_layer_worst5"] = single[:5]
    dws = [n.name for n in onnx.load(str(pre)).graph.node if n.op_type == "Conv" and group(n) > 1]
    variants = {
        "all_int8": ([], False, False),
        "all_int8_bias_corrected": ([], False, True),
        "all_int8_gptq_depthwise_bias_corrected": ([], True, True),
        "all_int8_bias_corrected_first_depthwise_float": (dws[:1], False, True),
        "all_int8_bias_corrected_every_depthwise_float": (dws, False, True),
    }
    paths = {}
    for name, (exclude, gptq, bias) in variants.items():
        q = Quantizer(pre, budget, flavour_for("onnxruntime"), reduce_range=False)
        path = q.quantize(budget / f"{name}.onnx", batches, exclude=exclude)
        if gptq:
            gptq_into_qdq(path, pre, hess)
        if bias:
            equalize.correct_bias(path, pre, means)
        paths[name] = path
        result[name] = score(run(base.session(path), held), ref)
        print(name, result[name], flush=True)
    result["activations_only"] = score(from_model(activations_only(paths["all_int8"], pre)), ref)
    sessions = {"fp32": base.session(pre), **{k: base.session(v) for k, v in paths.items()}}
    lat = base.latency(sessions, held, rounds=5, iters=15)
    for name in paths:
        result[name]["speed_vs_fp32"] = round(lat[name]["speedup_vs_fp32_median"], 2)
    result["setup"] = {
        "calibration": "48 crops of the calibration photos (seed 0, the stage's calibrated share of 64)",
        "heldout": f"{args.heldout_crops} crops of {', '.join(base.HELDOUT_PHOTOS)} (seed 1)",
        "load_average": list(os.getloadavg()),
    }
    base.emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
