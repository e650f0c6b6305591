"""Which onnxruntime.quantization settings make INT8 fast on this CPU? A handful of QDQ variants of one model,
all from the same calibration ranges, latency interleaved round-robin in one process (the machine is shared:
ratios are taken within a round, median over rounds), accuracy as in ``int8_cpu.py`` (trained 16-photo head,
held-out regions). Not a timed test: run by hand.

    python bench/int8_ort_variants.py --models mobilenet_v3_large,resnet18 --json bench/int8_ort_variants.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from int8_cpu import agreement, backbone, crops, export, features, interleaved_p50, photos, run_all, session, two_heads

CONV_GEMM = ["Conv", "Gemm", "MatMul"]


def squeeze_excite_nodes(model) -> list[str]:
    """torchvision SqueezeExcitation convs (fc1 / fc2 on the 1x1 pooled tensor)."""
    return [n.name for n in model.graph.node if n.op_type == "Conv" and ("/fc1/" in n.name or "/fc2/" in n.name)]


def depthwise_nodes(model) -> list[str]:
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)
    ]


def variants(model) -> dict[str, dict[str, Any]]:
    """Name -> quantize_static keyword overrides on top of QDQ, U8S8, per-channel, asymmetric activations,
    int32 bias, 8-bit weights (edgedeploy's onnxruntime flavour before it took ``reduce_range``)."""
    se, dw = squeeze_excite_nodes(model), depthwise_nodes(model)
    out: dict[str, dict[str, Any]] = {
        "u8s8_all_ops": {"reduce_range": False},
        "u8s8_conv_gemm_only": {"op_types_to_quantize": CONV_GEMM},
        "u8s8_per_tensor": {"per_channel": False},
        "u8s8_reduce_range": {"reduce_range": True},
        "u8u8_all_ops": {"weight_type": "QUInt8"},
        "s8s8_all_ops": {"activation_type": "QInt8"},
    }
    if se:
        out["u8s8_conv_gemm_only_no_se"] = {"op_types_to_quantize": CONV_GEMM, "nodes_to_exclude": se}
    if dw:
        out["u8s8_conv_gemm_only_no_se_no_depthwise"] = {"op_types_to_quantize": CONV_GEMM, "nodes_to_exclude": se + dw}
    return out


def quantize(fp32: Path, out: Path, cache: Path, reader, overrides: dict[str, Any]) -> Path:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    kw: dict[str, Any] = {
        "quant_format": QuantFormat.QDQ,
        "per_channel": True,
        "activation_type": "QUInt8",
        "weight_type": "QInt8",
        "calibrate_method": CalibrationMethod.MinMax,
        "extra_options": {"ActivationSymmetric": False, "WeightSymmetric": True, "QuantizeBias": True},
    }
    kw.update(overrides)
    kw["activation_type"] = getattr(QuantType, kw["activation_type"])
    kw["weight_type"] = getattr(QuantType, kw["weight_type"])
    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(
        str(fp32),
        str(out),
        calibration_data_reader=None if cache.is_file() else reader,
        calibration_cache_path=str(cache),
        **kw,
    )
    return out


def bench_one(name: str, args: argparse.Namespace, images: list[np.ndarray]) -> dict:
    import onnx
    import torch

    from edgedeploy.precision.data import OrtCalibrationReader
    from edgedeploy.precision.quantize import preprocess

    t0 = time.perf_counter()
    torch.set_num_threads(2)
    train_x, train_y = crops(images, args.train, seed=1, held_out=False)
    eval_x, _ = crops(images, args.samples, seed=2, held_out=True)
    calib = train_x[: args.calib]
    base = backbone(name, train_x[:128])
    net = two_heads(base, features(base, train_x), train_y, 1e-3)
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fp32_path = preprocess(export(net, calib[:1], work / "fp32.onnx", ["logits", "random_logits"]), work / "p.onnx")
        reader = OrtCalibrationReader([{"image": calib[i : i + 8]} for i in range(0, len(calib), 8)])
        fp32 = session(fp32_path, args.threads)
        ref = run_all(fp32, eval_x)[0]
        sessions = {"fp32": fp32}
        for i, (vname, overrides) in enumerate(variants(onnx.load(str(fp32_path))).items()):
            path = quantize(fp32_path, work / f"v{i}.onnx", work / "ranges.json", reader, overrides)
            sessions[vname] = session(path, args.threads)
            got = run_all(sessions[vname], eval_x)[0]
            a = agreement(ref, got)
            rows[vname] = {
                "settings": {k: v for k, v in overrides.items() if k != "nodes_to_exclude"}
                | ({"excluded_nodes": len(overrides["nodes_to_exclude"])} if "nodes_to_exclude" in overrides else {}),
                "top1_agreement_trained_head": a["top1_agreement"],
                "mean_cosine_trained_head": a["mean_cosine"],
                "qdq_nodes": sum(n.op_type == "QuantizeLinear" for n in onnx.load(str(path)).graph.node),
            }
        one = {"image": eval_x[:1]}
        torch.set_num_threads(args.threads)
        lat = interleaved_p50(
            {k: (lambda s=s: s.run(None, one)) for k, s in sessions.items()}, rounds=args.rounds, iters=args.iters
        )
    for vname, row in rows.items():
        row["p50_ms"] = float(np.median(lat[vname]))
        row["speedup_vs_ort_fp32"] = float(np.median(np.array(lat["fp32"]) / np.array(lat[vname])))
    return {
        "model": name,
        "ort_fp32_p50_ms": float(np.median(lat["fp32"])),
        "variants": rows,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mobilenet_v3_large,resnet18")
    parser.add_argument("--train", type=int, default=320)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--calib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import onnxruntime

    images = photos()
    result = {
        "command": "python bench/int8_ort_variants.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "json" and v is not None),
        "onnxruntime": onnxruntime.__version__,
        "rows": [bench_one(name, args, images) for name in args.models.split(",")],
        "load_average_after": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
