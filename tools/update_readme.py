"""Regenerate README's generated tables (flags, targets) from the code: `python tools/update_readme.py`.

tests/test_readme.py fails when README.md is out of date with these tables.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def flags_table() -> str:
    from edgedeploy.config_flags import flag_fields

    rows = ["| config field | flag | meaning |", "|---|---|---|"]
    rows += [f"| `{f.dotted}` | `{f.flag}` | {f.help} |" for f in flag_fields()]
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
    new = render(README.read_text())
    if "--check" in sys.argv:
        sys.exit(0 if new == README.read_text() else 1)
    README.write_text(new)
