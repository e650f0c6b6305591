"""Print uv arguments (one per line) equivalent to the index configuration pip reads here.

uv ignores pip.conf and PIP_* variables; the build machines configure their registries for pip only.
"""

from __future__ import annotations

import os
import subprocess
import sys


def pip_config() -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    conf: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.split(".", 1)[-1]
        conf.setdefault(name, value.strip().strip("'\""))
    for name in ("index-url", "extra-index-url", "find-links", "constraint"):
        env = os.environ.get("PIP_" + name.upper().replace("-", "_"))
        if env:
            conf[name] = env
    return conf


def main() -> None:
    conf = pip_config()
    args: list[str] = []
    if conf.get("index-url"):
        args += ["--index-url", conf["index-url"]]
    for url in conf.get("extra-index-url", "").split():
        args += ["--extra-index-url", url]
    for link in conf.get("find-links", "").split():
        args += ["--find-links", link]
    for path in conf.get("constraint", "").split():
        args += ["--constraint", path]
    # pip takes the best version across all indexes; uv's default stops at the first index that has the name
    args += ["--index-strategy", "unsafe-best-match"]
    print("\n".join(args))


if __name__ == "__main__":
    main()
