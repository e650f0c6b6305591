"""Build ten tiny random-weight Hugging Face architectures with the default settings (fp32; cpu by default).

Each model is made from a small config (no hub download), saved with ``save_pretrained`` into a
temporary folder, and built with ``[model] hf = folder`` and nothing else; the script prints one
line per architecture (route, exporter, seconds, or the error) and the x/10 count. ``--target`` builds for
another target; a device target's build passes here when its host stages do (the engine is built on the device).

    PYTHONPATH=$PWD .venv/bin/python bench/hf_arch_sweep.py [--json bench/hf_arch_sweep.json] [arch ...]
    PYTHONPATH=$PWD .venv/bin/python bench/hf_arch_sweep.py --target jetson-orin --json bench/hf_arch_sweep_orin.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hf_tiny import ARCHS, save_tiny


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("archs", nargs="*", default=list(ARCHS))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--target", default="cpu")
    args = ap.parse_args()
    import edgedeploy
    from edgedeploy.config import config_from_dict
    from edgedeploy.errors import DeployError
    from edgedeploy.targets import get_target

    on_device = not get_target(args.target).builds_here
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.archs:
            folder = save_tiny(arch, Path(tmp) / arch)
            out = str(Path(tmp) / f"out_{arch}")
            raw = {"model": {"hf": str(folder)}, "build": {"out": out, "cache": False, "target": args.target}}
            t0 = time.perf_counter()
            try:
                cfg = config_from_dict(raw, source=f"sweep:{arch}", base_dir=tmp)
                result = edgedeploy.build(cfg, log=lambda _line: None)
                m = result.report["metrics"]
                row = {
                    "arch": arch,
                    # a device target's report passes here and is validated on the device (result.ok is False)
                    "ok": result.ok or (on_device and result.report["status"] == "passed"),
                    "capture": m["capture"]["route"],
                    "exporter": m["export"]["exporter"],
                }
            except DeployError as exc:
                row = {"arch": arch, "ok": False, "error": exc.one_line()[:400]}
            row["seconds"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    ok = sum(r["ok"] for r in rows)
    print(f"{ok}/{len(rows)} architectures build with the defaults")
    if args.json:
        summary = {"target": args.target, "passed": ok, "total": len(rows), "rows": rows}
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
