"""Print one of README.md's two set-up commands, exactly as written: ``demo`` or ``tests``.

`.ci/run` runs what this prints, so CI runs the commands a new user copies from the README, and
tests/test_readme.py checks that it does.

Usage: python3 .ci/readme_commands.py demo|tests
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def setup_commands(text: str) -> dict[str, str]:
    """The ``bash`` blocks of the README's "Set-up commands" section: {"demo": ..., "tests": ...}.

    Raises:
        SystemExit: the section does not hold exactly two one-line bash blocks.
    """
    section = text.split("## Set-up commands", 1)[-1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)
    if len(blocks) != 2 or any("\n" in block for block in blocks):
        raise SystemExit("README.md: the 'Set-up commands' section must hold exactly two one-line bash blocks")
    return {"demo": blocks[0], "tests": blocks[1]}


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    commands = setup_commands(README.read_text())
    if which not in commands:
        raise SystemExit(f"usage: {sys.argv[0]} demo|tests")
    print(commands[which])
