"""Copy the installed tensorrt-stubs into a folder mypy can use, repairing their few syntax errors.

The published stubs (tensorrt-stubs 10.13) ship ``tensorrt/__init__.pyi`` without ``py.typed``
(so mypy ignores them in site-packages) and a handful of generated signatures that do not parse
(a parameter named ``in``; a parameter without default after defaulted ones). This writes a
parseable copy to DEST plus ``DEST/mypy.ini`` (stub-internal errors silenced); then run
``MYPYPATH=DEST mypy --config-file DEST/mypy.ini edgedeploy/trt/adapter.py``.

Usage: python .ci/trt_stubs.py DEST
"""

from __future__ import annotations

import ast
import re
import shutil
import sys
import sysconfig
from pathlib import Path

MYPY_INI = """[mypy]
python_version = 3.10
follow_imports = silent
ignore_missing_imports = True
warn_unused_ignores = True

[mypy-tensorrt,tensorrt.*,tensorrt_bindings,tensorrt_bindings.*]
ignore_errors = True
"""


def repair(path: Path) -> int:
    """Fix lines of ``path`` until it parses; returns the number of lines changed."""
    lines = path.read_text().splitlines()
    changed = 0
    for _ in range(200):
        try:
            ast.parse("\n".join(lines))
            break
        except SyntaxError as exc:
            i = (exc.lineno or 1) - 1
            line = lines[i]
            fixed = re.sub(r"([(,]\s*)in:", r"\1in_:", line)
            if fixed == line:  # defaults before a required parameter: drop the defaults on this line
                fixed = re.sub(r"\s*=\s*[^,()]+(?=[,)])", "", line)
            if fixed == line:
                raise SystemExit(f"{path}:{i + 1}: cannot repair: {line.strip()}") from None
            lines[i] = fixed
            changed += 1
    path.write_text("\n".join(lines) + "\n")
    return changed


def main() -> int:
    dest = Path(sys.argv[1])
    site = Path(sysconfig.get_paths()["purelib"])
    for pkg in ("tensorrt", "tensorrt_bindings"):
        if not (site / pkg).is_dir():
            print(f"tensorrt-stubs not installed (no {site / pkg}); pip install --no-deps tensorrt-stubs")
            return 1
        shutil.rmtree(dest / pkg, ignore_errors=True)
        shutil.copytree(site / pkg, dest / pkg)
    n = sum(repair(p) for p in dest.rglob("*.pyi"))
    (dest / "mypy.ini").write_text(MYPY_INI)
    print(f"tensorrt stubs ready in {dest} ({n} generated lines repaired)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
