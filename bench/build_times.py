"""Cold and warm ``deploy build`` wall times for a small zoo (cpu, fp32, default settings).

Cold: a fresh process and an empty stage cache. Warm: the same command again (every stage
cached). Each build runs ``python -m edgedeploy build`` in a subprocess, so interpreter and
import time count, as they do for a user. The machine's load average is recorded with the
figures: on a shared machine (other jobs running) absolute times are inflated; compare ratios
within one run.

    PYTHONPATH=$PWD .venv/bin/python bench/build_times.py [--json bench/build_times.json] [name ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

MODELS = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            return self.head(self.lstm(x)[0])


    def tiny_cnn():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(8, 5))


    def lstm():
        torch.manual_seed(0)
        return Tagger()
    """
)

VALIDATE = {"samples": 1, "latency_iters": 5, "latency_warmup": 1}
BATCH = {"min": 1, "opt": 1, "max": 4}


def zoo(folder: Path) -> dict[str, dict]:
    """name -> raw config (written next to the models module in ``folder``)."""
    (folder / "bench_models.py").write_text(MODELS)
    image = lambda size: [{"name": "image", "shape": ["batch", 3, size, size], "range": [-1.0, 1.0]}]  # noqa: E731
    return {
        "tiny_cnn": {
            "model": {"factory": "bench_models:tiny_cnn"},
            "inputs": image(32),
            "dims": {"batch": BATCH},
            "outputs": ["logits"],
        },
        "efficientnet_b0_224": {
            "model": {"factory": "torchvision.models:efficientnet_b0", "kwargs": {"num_classes": 1000}},
            "inputs": image(224),
            "dims": {"batch": BATCH},
            "outputs": ["logits"],
        },
        "mobilenet_v3_small_224": {
            "model": {"factory": "torchvision.models:mobilenet_v3_small"},
            "inputs": image(224),
            "dims": {"batch": BATCH},
            "outputs": ["logits"],
        },
        "lstm": {
            "model": {"factory": "bench_models:lstm"},
            "inputs": [{"name": "x", "shape": ["batch", "time", 8], "range": [-1.0, 1.0]}],
            "dims": {"batch": {"min": 1, "opt": 2, "max": 4}, "time": {"min": 1, "opt": 16, "max": 64}},
            "outputs": ["tags"],
        },
        "minilm_size_bert": {"model": {"hf": str(_minilm(folder))}},
    }


def _minilm(folder: Path) -> Path:
    """A random-weight BERT with MiniLM-L6-H384's shape (22M parameters)."""
    import torch
    import transformers as T
    from hf_tiny import save_tokenizer

    out = folder / "minilm"
    if not out.exists():
        torch.manual_seed(0)
        cfg = T.BertConfig(
            hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536, vocab_size=30522
        )
        T.BertModel(cfg).eval().save_pretrained(out)
        save_tokenizer(out)
    return out


def _toml(raw: dict, out: Path) -> str:
    import json as _json

    def value(v: object) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return _json.dumps(v)

    lines = [f"outputs = {value(raw['outputs'])}"] if "outputs" in raw else []
    lines += ["[model]"] + [f"{k} = {value(v)}" for k, v in raw["model"].items()]
    for spec in raw.get("inputs", []):
        lines += ["[[inputs]]"] + [f"{k} = {value(v)}" for k, v in spec.items()]
    for name, d in raw.get("dims", {}).items():
        lines += [f"[dims.{name}]"] + [f"{k} = {v}" for k, v in d.items()]
    lines += ["[validate]"] + [f"{k} = {v}" for k, v in VALIDATE.items()]
    lines += ["[build]", f"out = {value(str(out))}"]
    return "\n".join(lines) + "\n"


def timed_build(config: Path, cache: Path) -> tuple[float, int, str]:
    env = {**os.environ, "EDGEDEPLOY_CACHE_DIR": str(cache), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "edgedeploy", "build", "--config", str(config)], capture_output=True, text=True, env=env
    )
    return time.perf_counter() - t0, res.returncode, (res.stderr + res.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        models = zoo(folder)
        for name in args.names or list(models):
            config = folder / f"{name}.toml"
            config.write_text(_toml(models[name], folder / f"out_{name}"))
            load = os.getloadavg()[0]
            cold, rc, text = timed_build(config, folder / f"cache_{name}")
            warm, rc2, _ = timed_build(config, folder / f"cache_{name}")
            stages = [ln.strip() for ln in text.splitlines() if ln.startswith("[")]
            row = {"model": name, "cold_s": round(cold, 2), "warm_s": round(warm, 2), "ok": rc == 0 and rc2 == 0}
            row["load_avg_1min"] = round(load, 1)
            row["stages"] = stages
            if rc:
                row["error"] = text.strip().splitlines()[-1][:300] if text.strip() else f"exit {rc}"
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "stages"}), flush=True)
    doc = {
        "command": "PYTHONPATH=$PWD python bench/build_times.py --json bench/build_times.json",
        "cores": os.cpu_count(),
        "note": "shared machine: other jobs ran at the same time (see load_avg_1min per row)",
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
