"""INT8 vs FP32 top-1 agreement of a *trained* network on held-out real data: the digits CNN of
``examples/digits`` (scikit-learn's handwritten digits, stratified 20% held out), trained with ``deploy train``,
built with ``deploy build --precision int8 --calib <training digits .npy>`` for the cpu target, then both
``model.onnx`` and ``model.int8.onnx`` run in ONNX Runtime on the held-out digits. Not a timed test: run by hand.

    python bench/int8_digits.py --json bench/int8_digits.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def deploy(*argv: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "edgedeploy", *argv], cwd=cwd, check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import onnxruntime as ort

    from edgedeploy.train.config import load_train_config
    from edgedeploy.train.data import load_splits

    t0 = time.perf_counter()
    train_toml = ROOT / "examples/digits/train.toml"
    splits = load_splits(load_train_config(train_toml))  # the same split and normalization as deploy train
    x_test, y_test = (t.numpy() for t in splits.test.tensors)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        np.save(work / "calib.npy", splits.train.tensors[0].numpy())
        deploy("train", "--config", str(train_toml), "--out", str(work / "ckpt"), cwd=work)
        (work / "deploy.toml").write_text(
            '[model]\ncheckpoint = "ckpt/model.safetensors"\n[validate]\nclassifier_outputs = ["logits"]\n'
            '[build]\ntarget = "cpu"\nout = "out"\n'
        )
        deploy("build", "--config", "deploy.toml", "--precision", "int8", "--calib", "calib.npy", cwd=work)
        plan = json.loads((work / "out/precision.json").read_text())

        def logits(name: str) -> np.ndarray:
            sess = ort.InferenceSession(str(work / "out" / name), providers=["CPUExecutionProvider"])
            return np.concatenate([sess.run(None, {"image": x_test[i : i + 64]})[0] for i in range(0, len(x_test), 64)])

        fp32, int8 = logits("model.onnx"), logits("model.int8.onnx")
    result = {
        "command": "python bench/int8_digits.py",
        "heldout_digits": len(y_test),
        "calibration_samples_used": plan["calibration"]["samples_used"],
        "kept_float": plan["kept_float"],
        "fp32_accuracy": float((fp32.argmax(1) == y_test).mean()),
        "int8_accuracy": float((int8.argmax(1) == y_test).mean()),
        "top1_agreement_int8_vs_fp32": float((fp32.argmax(1) == int8.argmax(1)).mean()),
        "flips": int((fp32.argmax(1) != int8.argmax(1)).sum()),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
