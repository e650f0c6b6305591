"""Regenerate the generated tables (flags, targets) of README.md and docs/cli.md from the code:
`python tools/update_readme.py`. Each file holds the tables whose markers it has.

tests/test_readme.py fails when a file is out of date with these tables.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
CLI_DOC = README.parent / "docs" / "cli.md"
GENERATED = (README, CLI_DOC)


def flags_table() -> str:
    from edgedeploy.config_flags import flag_fields

    rows = ["| config field | flag | meaning |", "|---|---|---|"]
    for f in flag_fields():
        flag = f"`{f.flag}` / `{f.negative}`" if f.kind.startswith("bool") else f"`{f.flag}`"
        rows.append(f"| `{f.dotted}` | {flag} | {f.help} |")
    return "\n".join(rows)


def targets_table() -> str:
    from edgedeploy.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["targets"])
    return "```\n" + buf.getvalue().rstrip() + "\n```"


def render(text: str) -> str:
    for name, body in (("flags", flags_table()), ("targets", targets_table())):
        text = re.sub(
            rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)",
            lambda m, body=body: m.group(1) + body + "\n" + m.group(2),
            text,
            flags=re.S,
        )
    return text


if __name__ == "__main__":
    stale = []
    for path in GENERATED:
        new = render(path.read_text())
        if new != path.read_text():
            stale.append(path)
            if "--check" not in sys.argv:
                path.write_text(new)
    if "--check" in sys.argv and stale:
        print("stale: " + ", ".join(str(p) for p in stale), file=sys.stderr)
        sys.exit(1)
