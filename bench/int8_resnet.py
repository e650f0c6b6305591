"""INT8 speed and fidelity on a real pretrained ResNet-class CNN (plain convolutions), judged on held-out photos.

Model: the ResNet-50 that PyPI's ``imgsim`` (0.1.2, MIT) ships as ``imgsim/model.pth``: torchvision's ResNet-50
trained by AugNet self-supervised similarity learning (arXiv 2106.06250), its ``fc`` a 2048 -> 768 projection
followed by ``tanh``: an image *embedding* model, not an ImageNet classifier (no PyPI package found here bundles
ImageNet-classifier weights of a plain-conv CNN; see bench/README.md). So fidelity is the cosine of the INT8
embedding with the FP32 one, per image. Install: ``pip install --no-deps imgsim`` (its opencv dependency is not
needed: the weights are read as a plain state dict, ``torch.load(weights_only=True)``). No download at run time.

Photos: the real photos bundled with scikit-image and scikit-learn, split by photo as in ``bench/int8_cnn.py``:
64 crops of 9 photos calibrate, crops of 9 other photos judge. Input 224 x 224, ImageNet mean/std.

What runs:
1. ``deploy build --target cpu --precision int8 --calib photos/`` through ``edgedeploy.api.build`` at the
   default accuracy target (cosine 0.99 on the held-out calibration split);
2. plain ``onnxruntime.quantization.quantize_static`` with its defaults, calibrated on the same crops;
3. cosine with the FP32 embedding on the held-out crops (mean, 5th percentile, min), and latency at batch 1
   with one thread (ONNX Runtime CPU), the models interleaved round-robin in one process; ratios per round,
   median.

Usage: ``python bench/int8_resnet.py --json bench/int8_resnet.json`` (about 10 minutes on 2 shared cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from int8_cnn import CALIB_PHOTOS, HELDOUT_PHOTOS, crops, emit, latency, machine, ort_defaults, photos, session

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

MODEL_PY = textwrap.dedent(
    """
    import torch
    from torch import nn
    from torchvision.models import resnet50


    class Embedder(nn.Module):
        \"\"\"imgsim's AugNet ResNet-50: 768-d image embedding in (-1, 1).\"\"\"

        def __init__(self):
            super().__init__()
            self.net = resnet50(weights=None)
            self.net.fc = nn.Linear(2048, 768)

        def forward(self, image):
            return torch.tanh(self.net(image))


    def build():
        return Embedder()
    """
)

DEPLOY_TOML = textwrap.dedent(
    f"""
    outputs = ["embedding"]

    [model]
    factory = "imgsim_resnet50:build"
    checkpoint = "resnet50.safetensors"
    normalization = {{ mean = {list(MEAN)}, std = {list(STD)} }}

    [[inputs]]
    name = "image"
    shape = ["batch", 3, 224, 224]
    range = [-2.2, 2.7]

    [dims.batch]
    min = 1
    opt = 1
    max = 2

    [precision]
    calib_samples = 64

    [validate]
    samples = 1
    latency_iters = 5

    [build]
    out = "out"
    """
)


def write_project(folder: Path, calib_crops: list[np.ndarray]) -> Path:
    import importlib.util

    import torch
    from PIL import Image
    from safetensors.torch import save_file

    spec = importlib.util.find_spec("imgsim")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("imgsim is not installed: pip install --no-deps imgsim")
    weights = Path(list(spec.submodule_search_locations)[0]) / "model.pth"
    state = torch.load(weights, map_location="cpu", weights_only=True)
    state = {"net." + k.removeprefix("module.pre."): v.contiguous() for k, v in state.items()}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "imgsim_resnet50.py").write_text(MODEL_PY)
    save_file(state, str(folder / "resnet50.safetensors"))
    (folder / "photos").mkdir(exist_ok=True)
    for i, c in enumerate(calib_crops):
        Image.fromarray(c).save(folder / "photos" / f"crop{i:03d}.png")
    cfg = folder / "deploy.toml"
    cfg.write_text(DEPLOY_TOML)
    return cfg


def to_input(crops_u8: list[np.ndarray]) -> np.ndarray:
    x = np.stack(crops_u8).astype(np.float32) / 255.0
    x = (x - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    return x.transpose(0, 3, 1, 2).copy()


def embed(sess, x: np.ndarray) -> np.ndarray:
    return np.concatenate([sess.run(None, {"image": x[i : i + 1]})[0] for i in range(len(x))])


def cosines(a: np.ndarray, b: np.ndarray) -> dict:
    c = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"mean": float(c.mean()), "p5": float(np.percentile(c, 5)), "min": float(c.min())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--heldout-crops", type=int, default=135)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--workdir", type=Path, help="keep the project and builds here (default: a temp folder)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    pics = photos()
    calib_crops = crops([pics[n] for n in CALIB_PHOTOS], 64, seed=0)
    held = to_input(crops([pics[n] for n in HELDOUT_PHOTOS], args.heldout_crops, seed=1))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="int8-resnet-"))
    cfg = write_project(work / "project", calib_crops)
    sys.path.insert(0, str(cfg.parent))

    from edgedeploy.api import build
    from edgedeploy.errors import DeployError

    out = work / "out-cpu"
    lines: list[str] = []
    t0 = time.perf_counter()
    try:
        build(cfg, log=lines.append, build__target="cpu", build__out=str(out), precision__mode="int8",
              precision__calib=str(cfg.parent / "photos"))  # fmt: skip
        status, error = "passed", None
    except DeployError as exc:
        status, error = "failed", exc.one_line()
    info = json.loads((out / "precision.json").read_text()) if (out / "precision.json").is_file() else {}
    built = {
        "status": status,
        "error": error,
        "seconds": round(time.perf_counter() - t0, 1),
        "judged_on": info.get("judged_on"),
        "accuracy": info.get("accuracy"),
        "kept_float": [k["node"] for k in info.get("kept_float", [])],
    }
    print("deploy build:", json.dumps(built), flush=True)
    fp32_path = out / "model.onnx"
    if not fp32_path.is_file():
        fp32_path = next((out / ".cache" / "export").glob("*/model.onnx"), fp32_path)
    models = {"fp32": session(fp32_path)}
    if (out / "model.int8.onnx").is_file():
        models["int8_edgedeploy_build"] = session(out / "model.int8.onnx")
    x_calib = to_input(calib_crops)
    models["int8_ort_defaults"] = session(ort_defaults(fp32_path, x_calib, work / "ort_default.onnx"))
    ref = embed(models["fp32"], held)
    fidelity = {name: cosines(ref, embed(s, held)) for name, s in models.items() if name != "fp32"}
    print("cosine vs fp32", json.dumps(fidelity), flush=True)
    result = {
        "deploy_build_cpu_int8": built,
        "cosine_vs_fp32_heldout": fidelity,
        "latency_batch1_one_thread": latency(models, held, args.rounds, args.iters),
        "setup": {
            "model": "ResNet-50 (AugNet self-supervised, 768-d tanh embedding), weights from PyPI imgsim 0.1.2",
            "calibration": f"64 crops of {', '.join(CALIB_PHOTOS)}",
            "heldout": f"{args.heldout_crops} crops of {', '.join(HELDOUT_PHOTOS)} (never calibrated on)",
            **machine(args.rounds, args.iters),
        },
    }
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
