"""Write ``members-10.13.json``: class -> public member names of the real TensorRT 10.13 Python bindings.

The names are read from ``tensorrt-stubs`` 10.13 (generated from the real bindings), which CI's static checks
install (``.ci/install``) and the test extra does not: its ``tensorrt`` dependency cannot install on a machine
without NVIDIA's wheels. The tests read the committed JSON, so they run on a fresh machine.

Usage: ``python tests/data/trt_members/generate.py`` (with ``tensorrt-stubs==10.13.0.35.1`` installed).
"""

from __future__ import annotations

import json
import re
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_stubs(site: Path) -> dict[str, list[str]]:
    """Class -> sorted public member names of the stubs in ``site``, plus ``module`` (top-level names)."""
    src = (site / "tensorrt_bindings" / "tensorrt.pyi").read_text().splitlines()
    classes: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in src:
        m = re.match(r"^class (\w+)", line)
        if m:
            current = classes.setdefault(m.group(1), set())
            continue
        if current is None:
            continue
        for pattern in (r"^    def (\w+)", r"^    (\w+):", r":ivar (\w+):"):
            m = re.search(pattern, line)
            if m and not m.group(1).startswith("_"):
                current.add(m.group(1))
    init = (site / "tensorrt" / "__init__.pyi").read_text()
    classes["module"] = set(re.findall(r"^from tensorrt_bindings(?:\.tensorrt)? import (\w+)", init, re.M))
    classes["module"] |= set(re.findall(r"'(\w+)'", src[3])) | {"__version__", "nptype", "volume"}
    return {k: sorted(v) for k, v in sorted(classes.items())}


if __name__ == "__main__":
    members = parse_stubs(Path(sysconfig.get_paths()["purelib"]))
    out = HERE / "members-10.13.json"
    out.write_text(json.dumps({"source": "tensorrt-stubs==10.13.0.35.1", "classes": members}, indent=1) + "\n")
    print(f"wrote {out} ({len(members)} classes)")
