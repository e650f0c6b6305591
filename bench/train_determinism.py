"""What ``run.deterministic`` buys and costs on a CUDA GPU, ``"auto"`` (deterministic kernels) against ``"off"``
(the kernels torch picks by default).

- **bits**: two runs of ``deploy train``'s runner with the same seed, per mode: how many weight tensors differ.
  A 3-conv net (64 channels, 8x8 inputs) and torchvision's ResNet-18 (64x64 inputs), 3 epochs each.
- **speed**: training steps (forward, backward, SGD step; fp16 autocast with a GradScaler, as
  ``precision = "auto"`` trains on CUDA) of ResNet-18 and MobileNetV2 at 224x224, batch 128, the batch already
  on the GPU so the kernels are what is timed; each mode in turns per round inside
  :func:`edgedeploy.train.determinism.deterministic_kernels`, 5 warm-up and 20 timed steps; the median of the
  per-round ratios.

Needs a CUDA device (exits 2 without one).

    PYTHONPATH=$PWD python bench/train_determinism.py [--rounds 5] [--json bench/train_determinism.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from edgedeploy.train.config import train_config_from_dict
from edgedeploy.train.determinism import deterministic_kernels
from edgedeploy.train.runner import run_training

CONV_NET = """
from torch import nn


def net(num_classes=2):
    return nn.Sequential(nn.Conv2d(1, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, padding=1), nn.Flatten(), nn.Linear(64 * 8 * 8, num_classes))
"""
MODES = ("off", "auto")


def bits(folder: Path, name: str) -> dict:
    """Two runner runs per mode; the weight tensors that differ between them."""
    rng = np.random.default_rng(0)
    if name == "conv3":
        (folder / "convnet.py").write_text(CONV_NET)
        x, classes = rng.random((256, 1, 8, 8), dtype=np.float32), 2
        model = {"factory": "convnet:net", "python_path": ["."]}
    else:
        x, classes = rng.random((256, 3, 64, 64), dtype=np.float32), 10
        model = {"factory": "torchvision.models:resnet18", "kwargs": {"num_classes": classes}}
    np.savez(folder / "data.npz", x=x, y=rng.integers(0, classes, len(x)))
    row = {}
    for mode in MODES:
        raw = {
            "model": model,
            "data": {"dataset": "npz", "path": "data.npz", "batch_size": 32},
            "optim": {"lr": 0.01},
            "monitor": {"memory": False, "gradients": False},
            "run": {"epochs": 3, "device": "cuda", "deterministic": mode},
        }
        cfg = train_config_from_dict(raw, source=str(folder / "train.toml"), base_dir=folder)
        a, b = (
            load_file(str(run_training(cfg, folder / f"{mode}{i}", log=lambda _l: None).checkpoint)) for i in (0, 1)
        )
        differ = [k for k in a if not torch.equal(a[k], b[k])]
        worst = max((float((a[k].double() - b[k].double()).abs().max()) for k in differ), default=0.0)
        row[mode] = {"tensors_differing": len(differ), "tensors": len(a), "largest_difference": worst}
        print(f"bits  {name:9s} {mode:4s}: {len(differ)} of {len(a)} tensors differ (max {worst:.3g})", flush=True)
    return row


def step_ms(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, warmup: int = 5) -> float:
    """Milliseconds per fp16 training step, the GPU synchronised around the timed steps."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000 / steps


def speed(name: str, rounds: int) -> dict:
    import torchvision

    device = torch.device("cuda")
    model = getattr(torchvision.models, name)(num_classes=1000).to(device).train()
    x = torch.randn(128, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (128,), device=device)
    ms: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            with deterministic_kernels(mode, device, "bench/train_determinism.py"):
                ms[mode].append(step_ms(model, x, y, 20))
    ratios = [a / o for a, o in zip(ms["auto"], ms["off"])]
    row = {
        "ms_per_step": {m: [round(v, 2) for v in ms[m]] for m in MODES},
        "auto_over_off_time": round(statistics.median(ratios), 3),
        "per_round": [round(v, 3) for v in ratios],
    }
    print(f"speed {name:12s}: auto/off step time {row['auto_over_off_time']} (rounds {row['per_round']})", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("train_determinism: needs a CUDA device; none is visible here", file=sys.stderr)
        return 2
    doc: dict = {
        "command": "PYTHONPATH=$PWD python bench/train_determinism.py " + " ".join(sys.argv[1:]),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "bits": {},
        "speed": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("conv3", "resnet18"):
            folder = Path(tmp) / name
            folder.mkdir()
            doc["bits"][name] = bits(folder, name)
    for name in ("resnet18", "mobilenet_v2"):
        doc["speed"][name] = speed(name, args.rounds)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
