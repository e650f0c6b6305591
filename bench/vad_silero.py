"""Silero VAD v5 (a real Conv1d + LSTM sequence model) INT8 for cpu, calibrated and judged on real recorded speech.

Weights: ``silero_vad.onnx`` from the ``livekit-plugins-silero`` wheel. Audio: ``sample.wav`` (30 s of a real
two-speaker conversation, 16 kHz) and ``sample.rttm`` (who speaks when) from the ``pyannote-audio`` wheel. Both
wheels are only downloaded (``pip download --no-deps``) and read as zip files; nothing is installed and nothing
comes from a model hub. ``bench/silero/model.py`` rebuilds the network as a PyTorch module over whole waveforms
(its docstring has the layout read from the ONNX graph); this script first proves it equals the original ONNX
model run chunk by chunk with its state.

Split, never overlapping: the first 16.384 s of sample.wav (16 chunks of 1.024 s, silence and speech) are the
calibration file ``calib.npy`` (the build holds its last quarter out for judging); the remaining 13.6 s are the
held-out judge, never seen by any quantizer. Then, as a user would, with a deploy.toml (factory, checkpoint
written from the ONNX weights, input ``audio`` of shape [batch, time]) and the default accuracy target:

    deploy build --config deploy.toml --target cpu --out out-fp32
    deploy build --config deploy.toml --target cpu --precision int8 --calib calib.npy --out out-int8

each with a cold stage cache, timed. The peer is ``onnxruntime.quantization.quantize_static`` on the FP32
artifact with ``per_channel=True`` and the same 16 calibration chunks (everything else its defaults).

Side by side on the held-out speech (one sequence from a zero state): per-chunk (32 ms) decision agreement with
PyTorch FP32 at threshold 0.5, max / mean probability error, speech segments (0.5 threshold, gaps under 128 ms
closed, segments under 256 ms dropped) against PyTorch's and against the RTTM ground truth (a chunk is speech when
its centre lies in an RTTM turn), model size, and ONNX Runtime latency on 10.016 s of audio (one thread; the models
alternate round-robin, p50 per round, each round's ratio to FP32 taken within the round, median over rounds).

    python bench/vad_silero.py --workdir /tmp/vad --json bench/vad_silero.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import time
import wave
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "silero"))

import model as silero  # noqa: E402  (bench/silero/model.py, the deploy factory's module)

SR = 16000
CHUNK = silero.CHUNK
CALIB_CHUNKS, CALIB_LEN = 16, 32 * CHUNK  # 16 x 1.024 s
LATENCY_LEN = 313 * CHUNK  # 10.016 s
WHEELS = {
    "livekit-plugins-silero==1.8.9": (
        "livekit_plugins_silero-1.8.9-py3-none-any.whl",
        "livekit/plugins/silero/resources/silero_vad.onnx",
    ),
    "pyannote-audio==4.0.7": ("pyannote_audio-4.0.7-py3-none-any.whl", "pyannote/audio/sample/"),
}


def wheel_files(folder: Path) -> dict[str, bytes]:
    """silero_vad.onnx, sample.wav and sample.rttm, read from the two wheels (``pip download --no-deps`` into
    ``folder`` when not there yet)."""
    folder.mkdir(parents=True, exist_ok=True)
    missing = [req for req, (name, _) in WHEELS.items() if not (folder / name).exists()]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(folder)]
        subprocess.run([*cmd, *missing], check=True)
    silero_whl = zipfile.ZipFile(folder / WHEELS["livekit-plugins-silero==1.8.9"][0])
    pyannote_whl = zipfile.ZipFile(folder / WHEELS["pyannote-audio==4.0.7"][0])
    return {
        "silero_vad.onnx": silero_whl.read(WHEELS["livekit-plugins-silero==1.8.9"][1]),
        "sample.wav": pyannote_whl.read("pyannote/audio/sample/sample.wav"),
        "sample.rttm": pyannote_whl.read("pyannote/audio/sample/sample.rttm"),
    }


def read_wav(data: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(data)) as w:
        assert w.getframerate() == SR and w.getnchannels() == 1 and w.getsampwidth() == 2
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768


def rttm_turns(text: str) -> list[tuple[float, float]]:
    turns = []
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == "SPEAKER":
            turns.append((float(f[3]), float(f[3]) + float(f[4])))
    return turns


def onnx_streaming(onnx_path: Path, audio: np.ndarray) -> np.ndarray:
    """The original model as published: one call per 512 samples, 64 samples of context, (h, c) carried."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros(silero.CONTEXT, np.float32)
    sr = np.array(SR, np.int64)
    out = []
    for i in range(len(audio) // CHUNK):
        x = np.concatenate([context, audio[i * CHUNK : (i + 1) * CHUNK]])[None]
        prob, state = sess.run(None, {"input": x, "state": state, "sr": sr})
        out.append(float(prob[0, 0]))
        context = x[0, -silero.CONTEXT :]
    return np.array(out, np.float32)


def segments(prob: np.ndarray, start_s: float, threshold: float = 0.5) -> list[tuple[float, float]]:
    """Speech segments (seconds): chunks over ``threshold``, gaps under 4 chunks closed, runs under 8 dropped."""
    speech = prob > threshold
    runs, i = [], 0
    while i < len(speech):
        if speech[i]:
            j = i
            while j < len(speech) and speech[j]:
                j += 1
            runs.append([i, j])
            i = j
        else:
            i += 1
    merged: list[list[int]] = []
    for r in runs:
        if merged and r[0] - merged[-1][1] < 4:
            merged[-1][1] = r[1]
        else:
            merged.append(r)
    dt = CHUNK / SR
    return [(round(start_s + a * dt, 3), round(start_s + b * dt, 3)) for a, b in merged if b - a >= 8]


def truth_frames(turns: list[tuple[float, float]], start_s: float, n: int) -> np.ndarray:
    centres = start_s + (np.arange(n) + 0.5) * CHUNK / SR
    return np.array([any(a <= t < b for a, b in turns) for t in centres])


def segment_match(segs: list[tuple[float, float]], ref: list[tuple[float, float]]) -> int:
    """How many of ``ref``'s segments overlap one of ``segs`` by IoU >= 0.5."""

    def iou(a, b):
        inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
        return inter / (max(a[1], b[1]) - min(a[0], b[0]))

    return sum(any(iou(s, r) >= 0.5 for s in segs) for r in ref)


def session(path: Path, threads: int = 1):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def deploy(args: list[str], cwd: Path, cache: Path) -> dict:
    env = {**os.environ, "EDGEDEPLOY_CACHE_DIR": str(cache)}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "edgedeploy", *args], cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    verdict = [ln for ln in lines if ln.startswith(("PASSED", "FAILED", "error", "hint", "  hint"))]
    return {
        "command": "deploy " + " ".join(args),
        "exit_code": proc.returncode,
        "wall_s": round(seconds, 1),
        "load_avg_1min_before": round(load, 2),
        "load_avg_1min_after": round(os.getloadavg()[0], 2),
        "last_lines": verdict or lines[-3:],
    }


DEPLOY_TOML = """outputs = ["speech"]

[model]
factory = "model:build"
python_path = ["{python_path}"]
checkpoint = "silero_vad.safetensors"

[[inputs]]
name = "audio"
shape = ["batch", "time"]
range = [-1.0, 1.0]

[dims.batch]
min = 1
opt = 1
max = 4

[dims.time]
min = 512
opt = 16384
max = 32768
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/vad_silero"))
    ap.add_argument("--wheels", type=Path, default=Path.home() / ".cache" / "edgedeploy-bench" / "wheels")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    import onnx
    import onnxruntime as ort
    import torch

    from edgedeploy.precision.analysis import int8_compute_ops

    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    files = wheel_files(args.wheels)
    onnx_path = work / "silero_vad.onnx"
    onnx_path.write_bytes(files["silero_vad.onnx"])
    audio = read_wav(files["sample.wav"])
    turns = rttm_turns(files["sample.rttm"].decode())
    audio = audio[: len(audio) // CHUNK * CHUNK]

    # 1. the PyTorch module equals the published streaming model on the whole file
    net = silero.build()
    net.load_state_dict(silero.onnx_weights(onnx_path), strict=True)
    with torch.no_grad():
        torch_whole = net(torch.from_numpy(audio)[None]).numpy()[0]
    streaming = onnx_streaming(onnx_path, audio)
    parity = float(np.abs(torch_whole - streaming).max())
    print(f"PyTorch module vs silero_vad.onnx chunk by chunk with state, {len(streaming)} chunks: max abs {parity:.2e}")

    # 2. calibration file (first 16.384 s) and held-out audio (the rest), a deploy.toml written as a user would
    calib = audio[: CALIB_CHUNKS * CALIB_LEN].reshape(CALIB_CHUNKS, CALIB_LEN)
    np.save(work / "calib.npy", calib)
    held_start = CALIB_CHUNKS * CALIB_LEN
    held = audio[held_start:][None]
    held_start_s = held_start / SR
    silero.write_checkpoint(onnx_path, work / "silero_vad.safetensors")
    (work / "deploy.toml").write_text(DEPLOY_TOML.format(python_path=HERE / "silero"))

    # 3. the builds, each with a cold stage cache
    builds = {
        "fp32": deploy(
            ["build", "--config", "deploy.toml", "--target", "cpu", "--out", "out-fp32"], work, work / "cache-fp32"
        ),
        "int8": deploy(
            ["build", "--config", "deploy.toml", "--target", "cpu", "--precision", "int8"]
            + ["--calib", "calib.npy", "--out", "out-int8"],
            work,
            work / "cache-int8",
        ),
    }
    for name, b in builds.items():
        print(f"{name}: exit {b['exit_code']} in {b['wall_s']} s: {' | '.join(b['last_lines'])}")
    int8_report = json.loads((work / "out-int8" / "report.json").read_text())
    int8_plan = (
        json.loads((work / "out-int8" / "precision.json").read_text()) if builds["int8"]["exit_code"] == 0 else {}
    )

    # 4. the peer: ORT's static quantizer, per-channel, the same 16 calibration chunks
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Chunks(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows = iter([{"audio": row[None]} for row in calib])

        def get_next(self):
            return next(self.rows, None)

    peer = work / "ort_quantize_static.onnx"
    t0 = time.perf_counter()
    quantize_static(str(work / "out-fp32" / "model.onnx"), str(peer), Chunks(), per_channel=True)
    peer_s = time.perf_counter() - t0

    models = {"onnxruntime_fp32_artifact": work / "out-fp32" / "model.onnx"}
    if builds["int8"]["exit_code"] == 0:
        models["edgedeploy_int8"] = work / "out-int8" / "model.int8.onnx"
    models["ort_quantize_static_per_channel"] = peer

    # 5. side by side on the held-out speech
    with torch.no_grad():
        ref = net(torch.from_numpy(held)).numpy()[0]
    truth = truth_frames(turns, held_start_s, len(ref))
    ref_segs = segments(ref, held_start_s)
    truth_segs = segments(truth.astype(np.float32), held_start_s)
    rows = {
        "pytorch_fp32": {
            "agreement_with_pytorch": 1.0,
            "agreement_with_rttm": float(((ref > 0.5) == truth).mean()),
            "segments": ref_segs,
            "segments_matching_pytorch": len(ref_segs),
            "segments_matching_rttm": segment_match(ref_segs, truth_segs),
        }
    }
    whole_truth = truth_frames(turns, 0.0, len(torch_whole))
    # what the build's own judge sees: mean cosine over the 4 calibration chunks it held out (1.024 s each)
    stage_held = calib[CALIB_CHUNKS - CALIB_CHUNKS // 4 :]
    with torch.no_grad():
        stage_ref = net(torch.from_numpy(stage_held)).numpy()
    for name, path in models.items():
        prob = session(path).run(None, {"audio": held})[0][0]
        whole = session(path).run(None, {"audio": audio[None]})[0][0]
        segs = segments(prob, held_start_s)
        stage_prob = session(path).run(None, {"audio": stage_held})[0]
        cosines = [float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(stage_prob, stage_ref)]
        int8_nodes = int8_compute_ops(path)
        nodes = onnx.load(str(path)).graph.node
        compute = [n.name for n in nodes if n.op_type in ("Conv", "LSTM", "MatMul", "Gemm")]
        # ONNX Runtime has no QDQ LSTM kernel: an LSTM reading DequantizeLinear outputs still runs in float
        lstm_kernel = [n.op_type for n in nodes if "LSTM" in n.op_type]
        rows[name] = {
            "agreement_with_pytorch": float(((prob > 0.5) == (ref > 0.5)).mean()),
            "flipped_chunks": int(((prob > 0.5) != (ref > 0.5)).sum()),
            "agreement_with_rttm": float(((prob > 0.5) == truth).mean()),
            "max_abs_prob_error": float(np.abs(prob - ref).max()),
            "mean_abs_prob_error": float(np.abs(prob - ref).mean()),
            "segments": segs,
            "segments_matching_pytorch": segment_match(segs, ref_segs),
            "segments_matching_rttm": segment_match(segs, truth_segs),
            "whole_file_agreement_with_pytorch": float(((whole > 0.5) == (torch_whole > 0.5)).mean()),
            "whole_file_agreement_with_rttm": float(((whole > 0.5) == whole_truth).mean()),
            "build_heldout_chunks_mean_cosine": float(np.mean(cosines)),
            "build_heldout_chunks_agreement": float(((stage_prob > 0.5) == (stage_ref > 0.5)).mean()),
            "size_bytes": path.stat().st_size,
            "int8_compute_nodes": int8_nodes,  # edgedeploy's own definition (precision.analysis.int8_compute_ops)
            "float_compute_nodes": [n for n in compute if n not in int8_nodes],
            "lstm_kernel": lstm_kernel,
        }
    rows["pytorch_fp32"]["whole_file_agreement_with_rttm"] = float(((torch_whole > 0.5) == whole_truth).mean())

    # 6. latency, round-robin, 10.016 s of held-out audio at batch 1, one thread
    x = {"audio": audio[held_start : held_start + LATENCY_LEN][None]}
    sessions = {name: session(path) for name, path in models.items()}
    for s in sessions.values():
        for _ in range(3):
            s.run(None, x)
    load_before = os.getloadavg()
    p50s: dict[str, list[float]] = {n: [] for n in sessions}
    for _ in range(args.rounds):
        for name, s in sessions.items():
            times = []
            for _ in range(args.iters):
                t0 = time.perf_counter()
                s.run(None, x)
                times.append(time.perf_counter() - t0)
            p50s[name].append(float(np.median(times)) * 1e3)
    load_after = os.getloadavg()
    fp32 = p50s["onnxruntime_fp32_artifact"]
    for name in sessions:
        ratios = [f / m for f, m in zip(fp32, p50s[name])]
        rows[name]["latency_p50_ms_10s_audio"] = round(float(np.median(p50s[name])), 2)
        rows[name]["speed_vs_fp32"] = round(float(np.median(ratios)), 2)
        rows[name]["speed_vs_fp32_range"] = [round(min(ratios), 2), round(max(ratios), 2)]

    result = {
        "command": " ".join(["python", "bench/vad_silero.py", *sys.argv[1:]]),
        "host": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "cpu_flags_int8": sorted(
                f
                for f in Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split()
                if f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
            )
            if Path("/proc/cpuinfo").exists()
            else [],
            "load_average_latency_before": [round(v, 2) for v in load_before],
            "load_average_latency_after": [round(v, 2) for v in load_after],
            "onnxruntime": ort.__version__,
            "torch": torch.__version__,
        },
        "data": {
            "weights": "silero_vad.onnx from livekit-plugins-silero 1.8.9 (pip download --no-deps)",
            "audio": "sample.wav + sample.rttm from pyannote-audio 4.0.7 (pip download --no-deps)",
            "calibration": f"first {CALIB_CHUNKS * CALIB_LEN / SR:.3f} s: {CALIB_CHUNKS} chunks of "
            f"{CALIB_LEN / SR:.3f} s (calib.npy)",
            "heldout": f"{held_start_s:.3f} s to {len(audio) / SR:.3f} s: {len(ref)} chunks of 32 ms, one sequence",
            "heldout_speech_fraction_rttm": float(truth.mean()),
            "heldout_rttm_segments": truth_segs,
        },
        "pytorch_vs_original_onnx_streaming_max_abs": parity,
        "builds": builds,
        "peer_quantize_static_s": round(peer_s, 1),
        "int8_build": {
            "speedup_vs_fp32": int8_report.get("metrics", {}).get("precision", {}).get("speedup_vs_fp32"),
            "warnings": int8_report.get("warnings", []),
            "accuracy": int8_plan.get("accuracy"),
            "accuracy_target": int8_plan.get("accuracy_target"),
            "recurrent_int8": int8_plan.get("recurrent_int8"),
            "judged_on": int8_plan.get("judged_on"),
            "kept_float": [k["node"] for k in int8_plan.get("kept_float", [])],
        },
        "models": rows,
    }
    for name, r in rows.items():
        print(
            f"{name:34s} agree {r['agreement_with_pytorch']:.4f}  rttm {r['agreement_with_rttm']:.4f}  "
            f"maxerr {r.get('max_abs_prob_error', 0):.3f}  segs {len(r['segments'])} "
            f"(match pytorch {r['segments_matching_pytorch']}, rttm {r['segments_matching_rttm']})  "
            f"p50 {r.get('latency_p50_ms_10s_audio', '-')} ms  x{r.get('speed_vs_fp32', '-')}  "
            f"{r.get('size_bytes', 0) / 1e6:.2f} MB"
        )
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
