"""Regenerate the docs' generated tables from the code: `python tools/update_readme.py`.

README.md holds the targets table, docs/config.md the flags table; tests/test_readme.py fails when either is out of
date (`--check`).
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONFIG_DOC = ROOT / "docs" / "config.md"
GENERATED = {README: ("targets",), CONFIG_DOC: ("flags",)}


def flags_table() -> str:
    from edgedeploy.config import flag_fields

    rows = ["| config field | flag | meaning |", "|---|---|---|"]
    rows += [f"| `{f.dotted}` | `{f.flag}` | {f.help} |" for f in flag_fields()]
    return "\n".join(rows)


def targets_table() -> str:
    from edgedeploy.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["targets"])
    return "```\n" + buf.getvalue().rstrip() + "\n```"


def render(text: str, names: tuple[str, ...] = ("flags", "targets")) -> str:
    tables = {"flags": flags_table, "targets": targets_table}
    for name in names:
        body = tables[name]()
        text = re.sub(
            rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)",
            lambda m, body=body: m.group(1) + body + "\n" + m.group(2),
            text,
            flags=re.S,
        )
    return text


if __name__ == "__main__":
    stale = []
    for path, names in GENERATED.items():
        old = path.read_text()
        new = render(old, names)
        if new != old:
            stale.append(path.name)
            if "--check" not in sys.argv:
                path.write_text(new)
    if "--check" in sys.argv and stale:
        sys.exit(f"stale generated tables in {', '.join(stale)}: run `python tools/update_readme.py`")
