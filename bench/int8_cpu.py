"""INT8 vs FP32 on this CPU: ONNX Runtime QDQ (U8S8) vs ONNX Runtime FP32 vs PyTorch eager, and top-1 agreement.

ResNet-18 and MobileNetV3-Large from torchvision with seeded random weights whose BatchNorm running
statistics are re-estimated on real photos (so activations look like a trained net's), calibrated with
edgedeploy's own quantizer on real photo crops and evaluated on other crops of the same photos
(skimage.data + sklearn's sample images, random resized crops and flips). Not a timed test: run by hand.

    python bench/int8_cpu.py --samples 300 --calib 64 --iters 30 --threads 1 --json bench/int8_cpu.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)


def photos() -> list[np.ndarray]:
    import skimage.data
    from sklearn.datasets import load_sample_images

    imgs = [getattr(skimage.data, n)() for n in ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry")]
    return imgs + list(load_sample_images().images)


def crops(images: list[np.ndarray], count: int, seed: int, size: int = 224) -> np.ndarray:
    """Random resized crops (20-100% of the side) with random horizontal flips, ImageNet-normalized NCHW."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = np.empty((count, 3, size, size), np.float32)
    for i in range(count):
        img = images[int(rng.integers(len(images)))]
        h, w = img.shape[:2]
        side = int(min(h, w) * rng.uniform(0.2, 1.0))
        y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        patch = Image.fromarray(img[y : y + side, x : x + side]).resize((size, size), Image.Resampling.BILINEAR)
        arr = np.asarray(patch, np.float32).transpose(2, 0, 1) / 255.0
        if rng.random() < 0.5:
            arr = arr[:, :, ::-1]
        out[i] = (arr - MEAN) / STD
    return out


def model(name: str, bn_data: np.ndarray):
    """Seeded random torchvision model, BatchNorm statistics re-estimated on ``bn_data``, in eval mode."""
    import torch
    import torchvision

    torch.manual_seed(0)
    net = getattr(torchvision.models, name)(weights=None)
    for m in net.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # cumulative average over all batches
    net.train()
    with torch.no_grad():
        for i in range(0, len(bn_data), 16):
            net(torch.from_numpy(bn_data[i : i + 16]))
    return net.eval()


def export(net, example: np.ndarray, path: Path) -> Path:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (torch.from_numpy(example),),
            str(path),
            input_names=["image"],
            output_names=["logits"],
            dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    return path


def session(path: Path, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def p50_ms(fn, x: np.ndarray, iters: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn(x)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def logits(sess, data: np.ndarray, batch: int = 16) -> np.ndarray:
    return np.concatenate([sess.run(None, {"image": data[i : i + batch]})[0] for i in range(0, len(data), batch)])


def bench_one(name: str, args: argparse.Namespace, images: list[np.ndarray]) -> dict:
    import torch

    from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess, quantize_with_fallback

    t_start = time.perf_counter()
    net = model(name, crops(images, 128, seed=3))
    calib = crops(images, args.calib, seed=1)
    evalset = crops(images, args.samples, seed=2)
    row: dict = {"model": name}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fp32_path = preprocess(export(net, calib[:1], work / "fp32.onnx"), work / "fp32.pre.onnx")
        q = Quantizer(fp32_path, work, flavour_for("onnxruntime"), method=args.method, per_channel=True)
        batches = [{"image": calib[i : i + 8]} for i in range(0, len(calib), 8)]
        naive = q.quantize(work / "int8.onnx", batches)
        fp32, int8 = session(fp32_path, args.threads), session(naive, args.threads)
        ref, got = logits(fp32, evalset), logits(int8, evalset)
        row["top1_agreement_int8_vs_fp32"] = float((ref.argmax(1) == got.argmax(1)).mean())
        cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
        row["mean_cosine_int8_vs_fp32"] = float(cos.mean())
        with torch.no_grad():
            eager = net(torch.from_numpy(evalset[:16])).numpy()
        row["max_abs_ort_fp32_vs_torch"] = float(np.abs(eager - ref[:16]).max())
        one = evalset[:1]
        torch.set_num_threads(args.threads)
        with torch.inference_mode():
            row["torch_eager_ms"] = p50_ms(lambda x: net(torch.from_numpy(x)), one, args.iters)
        row["ort_fp32_ms"] = p50_ms(lambda x: fp32.run(None, {"image": x}), one, args.iters)
        row["ort_int8_ms"] = p50_ms(lambda x: int8.run(None, {"image": x}), one, args.iters)
        row["int8_speedup_vs_ort_fp32"] = row["ort_fp32_ms"] / row["ort_int8_ms"]
        row["int8_speedup_vs_torch"] = row["torch_eager_ms"] / row["ort_int8_ms"]
        if args.fallback and row["top1_agreement_int8_vs_fp32"] < 0.99:
            fb = quantize_with_fallback(
                q,
                out=work / "int8.fallback.onnx",
                batches=batches,
                classifier_outputs=["logits"],
                accuracy_target=0.99,
                max_tries=args.fallback,
            )
            sess = session(fb.model, args.threads)
            got_fb = logits(sess, evalset)
            row["fallback"] = {
                "kept_float": list(fb.excluded),
                "met_on_calibration_set": fb.met,
                "top1_agreement_int8_vs_fp32": float((ref.argmax(1) == got_fb.argmax(1)).mean()),
                "ort_int8_ms": p50_ms(lambda x: sess.run(None, {"image": x}), one, args.iters),
            }
    row["seconds"] = round(time.perf_counter() - t_start, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v3_large")
    parser.add_argument("--samples", type=int, default=300, help="evaluation crops")
    parser.add_argument("--calib", type=int, default=64, help="calibration crops")
    parser.add_argument("--method", default="minmax", choices=["minmax", "entropy", "percentile"])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fallback", type=int, default=0, help="max fallback tries when agreement < 99%% (0: off)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import onnxruntime
    import torch

    images = photos()
    rows = [bench_one(name, args, images) for name in args.models.split(",")]
    result = {
        "command": "python bench/int8_cpu.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "json" and v is not None),
        "onnxruntime": onnxruntime.__version__,
        "torch": torch.__version__,
        "rows": rows,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
