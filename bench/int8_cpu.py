"""INT8 vs FP32 on this CPU: ONNX Runtime QDQ INT8 vs ONNX Runtime FP32 vs PyTorch eager, and top-1 agreement.

No pretrained weights can be downloaded here, and a random 1000-class head has near-tied logits whose arg-max
any tiny noise flips, so the agreement of a random model says little. This benchmark therefore trains a real
(small) classification task offline and reports both heads:

- task: which of 16 real photos (skimage.data + sklearn's sample images) a random resized crop comes from.
  Every photo is split by columns: training, BatchNorm and calibration crops come from its left 65%,
  evaluation crops only from its right 35% (held-out regions, other seeds, flips and brightness jitter);
- backbone: torchvision ResNet-18 / MobileNetV3-Large, seeded random weights, BatchNorm running statistics
  re-estimated on training crops;
- ``logits`` (trained head): the final Linear replaced by a multinomial logistic regression fitted on the frozen
  penultimate features of the training crops, then the last stage (ResNet ``layer4``, MobileNetV3's last four
  feature blocks and classifier MLP) and that head fine-tuned briefly on the training crops (AdamW, cached trunk
  outputs, BatchNorm re-estimated after); ``--finetune-epochs 0`` keeps the linear probe alone. The earlier
  stages keep their random weights: this is a trained *head*, not a trained network;
- ``random_logits``: the original seeded random 1000-class Linear on the same features (second output).

The exported model (both heads, opset 17) is quantized by edgedeploy's own ``Quantizer`` on 64 training crops
in the onnxruntime flavour, once with 8-bit and once with 7-bit weights (``reduce_range``, the default now),
and agreement is measured on held-out crops only: the held-out regions, and fresh crops of the training
regions (other seed, flips and jitter; none of them calibration data). Latency: batch 1, 224x224, 1 thread,
p50, torch eager / ORT FP32 / both INT8 models interleaved round-robin in one process (the machine is shared),
ratios taken within each round, median over rounds. Not a timed test: run by hand.

    python bench/int8_cpu.py --json bench/int8_cpu.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)
INT8_VARIANTS = {"ort_int8_u8s8": False, "ort_int8_u8s8_reduce_range": True}  # name -> 7-bit weights
TRAIN_COLUMNS = 0.65  # left share of every photo for training / calibration; the rest is held out
SKIMAGE_PHOTOS = (
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "immunohistochemistry",
    "retina",
    "hubble_deep_field",
    "camera",
    "brick",
    "grass",
    "gravel",
    "coins",
    "moon",
    "clock",
)


def photos() -> list[np.ndarray]:
    """The offline photos as RGB uint8 arrays (grayscale ones replicated to 3 channels)."""
    import skimage.data
    from sklearn.datasets import load_sample_images

    imgs = [getattr(skimage.data, n)() for n in SKIMAGE_PHOTOS] + list(load_sample_images().images)
    return [np.repeat(im[:, :, None], 3, axis=2) if im.ndim == 2 else im[:, :, :3] for im in imgs]


def crops(
    images: list[np.ndarray], count: int, seed: int, *, held_out: bool, size: int = 224
) -> tuple[np.ndarray, np.ndarray]:
    """Random resized crops (30-100% of the region's short side), flips and +-20% brightness, ImageNet-normalized
    NCHW, with the index of the source photo as label. ``held_out`` draws from the right part of every photo.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = np.empty((count, 3, size, size), np.float32)
    labels = rng.integers(len(images), size=count)
    for i, label in enumerate(labels):
        img = images[int(label)]
        h, w = img.shape[:2]
        split = int(w * TRAIN_COLUMNS)
        x0, x1 = (split, w) if held_out else (0, split)
        side = int(min(h, x1 - x0) * rng.uniform(0.3, 1.0))
        y, x = int(rng.integers(0, h - side + 1)), x0 + int(rng.integers(0, x1 - x0 - side + 1))
        patch = Image.fromarray(img[y : y + side, x : x + side]).resize((size, size), Image.Resampling.BILINEAR)
        arr = np.asarray(patch, np.float32).transpose(2, 0, 1) / 255.0 * rng.uniform(0.8, 1.2)
        if rng.random() < 0.5:
            arr = arr[:, :, ::-1]
        out[i] = (np.clip(arr, 0.0, 1.0) - MEAN) / STD
    return out, labels


def backbone(name: str, bn_data: np.ndarray):
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


def final_linear(net):
    """The model's last Linear (the 1000-class head) and a setter that replaces it."""
    if hasattr(net, "fc"):
        return net.fc, lambda m: setattr(net, "fc", m)
    return net.classifier[-1], lambda m: net.classifier.__setitem__(len(net.classifier) - 1, m)


def features(net, data: np.ndarray, batch: int = 32) -> np.ndarray:
    """Penultimate features (the input of the final Linear)."""
    import torch

    head, put = final_linear(net)
    put(torch.nn.Identity())
    try:
        with torch.inference_mode():
            return np.concatenate(
                [net(torch.from_numpy(data[i : i + batch])).numpy() for i in range(0, len(data), batch)]
            )
    finally:
        put(head)


def two_heads(net, feats: np.ndarray, labels: np.ndarray, weight_decay: float):
    """``net`` with outputs (trained logits, random 1000-class logits). The trained head is a multinomial logistic
    regression on ``feats`` (full-batch L-BFGS on standardized features, the standardization folded into the Linear).
    """
    import torch

    mean, std = feats.mean(0), feats.std(0) + 1e-6
    z, t = torch.from_numpy((feats - mean) / std), torch.from_numpy(labels)
    torch.manual_seed(0)
    probe = torch.nn.Linear(feats.shape[1], int(labels.max()) + 1)
    opt = torch.optim.LBFGS(probe.parameters(), lr=1.0, max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(probe(z), t) + weight_decay * probe.weight.square().sum()
        loss.backward()
        return loss

    opt.step(closure)
    random_head, put = final_linear(net)
    trained = torch.nn.Linear(feats.shape[1], probe.out_features)
    with torch.no_grad():
        w = probe.weight / torch.from_numpy(std)
        trained.weight.copy_(w)
        trained.bias.copy_(probe.bias - w @ torch.from_numpy(mean))
    put(torch.nn.Identity())

    class TwoHeads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head, self.random_head = net, trained, random_head

        def forward(self, x):
            f = self.body(x)
            return self.head(f), self.random_head(f)

    return TwoHeads().eval()


def trunk_and_tail(body):
    """(frozen trunk, last stage up to the penultimate features) of a torchvision ResNet / MobileNetV3 whose
    final Linear is already replaced; both share their modules with ``body``."""
    import torch

    nn = torch.nn
    if hasattr(body, "layer4"):
        trunk = nn.Sequential(body.conv1, body.bn1, body.relu, body.maxpool, body.layer1, body.layer2, body.layer3)
        return trunk, nn.Sequential(body.layer4, body.avgpool, nn.Flatten(1))
    last = len(body.features) - 4  # MobileNetV3-Large: the 160-channel blocks and the final 1x1 conv
    return body.features[:last], nn.Sequential(body.features[last:], body.avgpool, nn.Flatten(1), body.classifier)


def finetune_last_stage(net, data: np.ndarray, labels: np.ndarray, epochs: int, lr: float, batch: int = 32) -> None:
    """Train the last stage and the trained head of ``two_heads``'s model on cached trunk outputs (AdamW,
    cross-entropy), then re-estimate the last stage's BatchNorm statistics with the final weights."""
    import torch

    trunk, tail = trunk_and_tail(net.body)
    with torch.inference_mode():
        cached = torch.cat([trunk(torch.from_numpy(data[i : i + batch])) for i in range(0, len(data), batch)])
    cached, target = cached.clone(), torch.from_numpy(labels)
    bns = [m for m in tail.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in bns:
        m.momentum = 0.1
    params = [*tail.parameters(), *net.head.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(0)
    tail.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(cached), generator=gen).split(batch):
            loss = torch.nn.functional.cross_entropy(net.head(tail(cached[idx])), target[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    with torch.no_grad():
        for i in range(0, len(cached), batch):
            tail(cached[i : i + batch])
    net.eval()


def export(net, example: np.ndarray, path: Path, outputs: list[str]) -> Path:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (torch.from_numpy(example),),
            str(path),
            input_names=["image"],
            output_names=outputs,
            dynamic_axes={"image": {0: "batch"}, **{o: {0: "batch"} for o in outputs}},
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
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def run_all(sess, data: np.ndarray, batch: int = 16) -> list[np.ndarray]:
    parts = [sess.run(None, {"image": data[i : i + batch]}) for i in range(0, len(data), batch)]
    return [np.concatenate(p) for p in zip(*parts)]


def interleaved_p50(fns: dict[str, Callable[[], object]], rounds: int, iters: int) -> dict[str, list[float]]:
    """p50 latency (ms) of every function per round; functions alternate within a round so load drifts hit all."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            out[name].append(float(np.median(times)))
    return out


def ratio(per_round: dict[str, list[float]], num: str, den: str) -> float:
    """Median over rounds of num/den latency measured in the same round."""
    return float(np.median(np.array(per_round[num]) / np.array(per_round[den])))


def agreement(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    top2 = np.sort(ref, axis=1)[:, -2:]
    cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
    return {
        "top1_agreement": float((ref.argmax(1) == got.argmax(1)).mean()),
        "flips": int((ref.argmax(1) != got.argmax(1)).sum()),
        "mean_cosine": float(cos.mean()),
        "median_fp32_top1_top2_margin": float(np.median(top2[:, 1] - top2[:, 0])),
    }


def bench_one(name: str, args: argparse.Namespace, images: list[np.ndarray]) -> dict:
    import torch

    from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess

    t_start = time.perf_counter()
    torch.set_num_threads(args.train_threads)
    train_x, train_y = crops(images, args.train, seed=1, held_out=False)
    eval_x, eval_y = crops(images, args.samples, seed=2, held_out=True)
    fresh = crops(images, args.samples, seed=3, held_out=False)  # new crops / flips / jitter, seen regions
    calib = train_x[: args.calib]
    base = backbone(name, train_x[:128])
    feats = features(base, train_x)
    net = two_heads(base, feats, train_y, args.weight_decay)
    if args.finetune_epochs:
        finetune_last_stage(net, train_x, train_y, args.finetune_epochs, args.lr)
    with torch.inference_mode():
        eager = [t.numpy() for t in net(torch.from_numpy(eval_x[:16]))]
    row: dict = {"model": name, "classes": len(images), "train_crops": args.train, "calib_crops": args.calib}
    sets = {"heldout_regions": (eval_x, eval_y), "fresh_crops_training_regions": fresh}
    flavour = flavour_for("onnxruntime")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        raw = export(net, calib[:1], work / "fp32.onnx", ["logits", "random_logits"])
        fp32_path = preprocess(raw, work / "fp32.pre.onnx")
        batches = [{"image": calib[i : i + 8]} for i in range(0, len(calib), 8)]
        sessions = {"ort_fp32": session(fp32_path, args.threads)}
        for key, reduce in INT8_VARIANTS.items():  # one calibration (the Quantizer's range cache), two quantizations
            q = Quantizer(fp32_path, work, replace(flavour, reduce_range=reduce), method=args.method, per_channel=True)
            sessions[key] = session(q.quantize(work / f"{key}.onnx", batches), args.threads)
        for set_name, (x, y) in sets.items():
            ref, ref_rand = run_all(sessions["ort_fp32"], x)
            row[set_name] = {"crops": len(x), "fp32_accuracy": float((ref.argmax(1) == y).mean())}
            for key in INT8_VARIANTS:
                got, got_rand = run_all(sessions[key], x)
                row[set_name][key] = {
                    "accuracy": float((got.argmax(1) == y).mean()),
                    "trained_head_vs_fp32": agreement(ref, got),
                    "random_head_vs_fp32": agreement(ref_rand, got_rand),
                }
        ref, ref_rand = run_all(sessions["ort_fp32"], eval_x[:16])
        row["max_abs_ort_fp32_vs_torch"] = float(max(np.abs(eager[0] - ref).max(), np.abs(eager[1] - ref_rand).max()))
        feed = {"image": eval_x[:1]}
        torch.set_num_threads(args.threads)
        fns: dict[str, Callable[[], object]] = {"torch_eager": lambda: net(torch.from_numpy(feed["image"]))}
        fns |= {k: (lambda s=s: s.run(None, feed)) for k, s in sessions.items()}
        with torch.inference_mode():
            lat = interleaved_p50(fns, rounds=args.rounds, iters=args.iters)
    row["latency_ms_p50_median_over_rounds"] = {k: round(float(np.median(v)), 2) for k, v in lat.items()}
    row["speedup_ort_fp32_vs_torch_eager"] = ratio(lat, "torch_eager", "ort_fp32")
    for key in INT8_VARIANTS:
        row[f"speedup_{key}_vs_ort_fp32"] = ratio(lat, "ort_fp32", key)
        row[f"speedup_{key}_vs_torch_eager"] = ratio(lat, "torch_eager", key)
        row[f"speedup_{key}_vs_ort_fp32_per_round"] = [round(a / b, 3) for a, b in zip(lat["ort_fp32"], lat[key])]
    row["seconds"] = round(time.perf_counter() - t_start, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v3_large")
    parser.add_argument("--train", type=int, default=640, help="training crops (left part of every photo)")
    parser.add_argument("--samples", type=int, default=400, help="held-out evaluation crops (right part)")
    parser.add_argument("--calib", type=int, default=64, help="calibration crops (the first training crops)")
    parser.add_argument("--weight-decay", type=float, default=1e-3, help="L2 penalty of the logistic-regression head")
    parser.add_argument("--finetune-epochs", type=int, default=4, help="last-stage fine-tuning (0: linear probe)")
    parser.add_argument("--lr", type=float, default=3e-4, help="fine-tuning learning rate (AdamW)")
    parser.add_argument("--method", default="minmax", choices=["minmax", "entropy", "percentile"])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved latency rounds")
    parser.add_argument("--iters", type=int, default=10, help="runs per model per round")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads for the latency runs")
    parser.add_argument("--train-threads", type=int, default=2, help="torch threads for feature extraction")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import os

    import onnxruntime
    import torch

    images = photos()
    rows = [bench_one(name, args, images) for name in args.models.split(",")]
    result = {
        "command": "python bench/int8_cpu.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "json" and v is not None),
        "onnxruntime": onnxruntime.__version__,
        "torch": torch.__version__,
        "load_average_after": os.getloadavg(),
        "rows": rows,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
