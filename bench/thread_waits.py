"""How PyTorch's OpenMP wait policy moves a forward of EfficientNet-Lite0 (TorchScript, batch 1), on an idle
machine and with busy processes competing for the cores: the figures behind ``edgedeploy/pipeline/threads.py``.

Each policy runs in a fresh process (OpenMP reads its settings once, when torch loads): the spinning default,
``OMP_WAIT_POLICY=PASSIVE`` and ``GOMP_SPINCOUNT`` = 10000 (what a build's process sets where torch ships GNU
OpenMP). The median and slowest of 15 forwards after 3 warm-ups are reported; ``--busy N`` starts N spinning
processes for the loaded rows. Real weights are not needed for timing: the model is built by its factory.

    PYTHONPATH=$PWD .venv/bin/python bench/thread_waits.py [--busy 6] [--json bench/thread_waits.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

POLICIES = {
    "spinning (default)": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
}
FORWARD = """
import json, time, torch
from efficientnet_lite_pytorch import EfficientNet
model = torch.jit.trace(EfficientNet.from_name("efficientnet-lite0").eval(), torch.randn(1, 3, 224, 224))
x = torch.randn(1, 3, 224, 224)
with torch.inference_mode():
    for _ in range(3):
        model(x)
    ms = []
    for _ in range(15):
        t0 = time.perf_counter(); model(x); ms.append((time.perf_counter() - t0) * 1e3)
ms.sort()
print(json.dumps({"median_ms": round(ms[7], 1), "slowest_ms": round(ms[-1], 1)}))
"""


def forward_ms(extra_env: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    proc = subprocess.run([sys.executable, "-c", FORWARD], env={**env, **extra_env}, capture_output=True, text=True)
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1][:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--busy", type=int, default=6, help="spinning processes for the loaded rows")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    doc: dict = {"command": "PYTHONPATH=$PWD python bench/thread_waits.py " + " ".join(sys.argv[1:]),
                 "cores": os.cpu_count(), "load_avg_1min": round(os.getloadavg()[0], 1), "rows": []}  # fmt: skip
    for name, env in POLICIES.items():
        doc["rows"].append({"policy": name, "busy": 0, **forward_ms(env)})
        print(doc["rows"][-1], flush=True)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        for name, env in POLICIES.items():
            doc["rows"].append({"policy": name, "busy": args.busy, **forward_ms(env)})
            print(doc["rows"][-1], flush=True)
    finally:
        for proc in spinners:
            proc.kill()
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
