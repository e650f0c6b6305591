"""README stays true: generated tables current, set-up commands present, documented commands exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_generated_tables_are_current():
    res = subprocess.run([sys.executable, "tools/update_readme.py", "--check"], cwd=ROOT, timeout=120)
    assert res.returncode == 0, "README.md is stale: run `python tools/update_readme.py`"


def test_exactly_two_setup_commands_and_their_files_exist():
    setup = README.split("## Set-up commands", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)\n```", setup, flags=re.S)
    assert len(blocks) == 2
    demo, tests = blocks
    assert "deploy build" in demo and "pytest" in tests
    for path in re.findall(r"(examples/\S+\.(?:py|toml))", demo):
        assert (ROOT / path).is_file(), path
    ci = (ROOT / ".ci" / "run").read_text()
    command = '-m pytest -n auto -m "not slow"'  # CI runs README's command, then the slow step
    assert command in ci and command in tests
    assert "-m pytest -n auto -m slow" in ci


def test_documented_subcommands_exist():
    from edgedeploy.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    documented = set(re.findall(r"^\| `deploy (\w+)", README, flags=re.M))
    assert documented, "commands table missing"
    assert documented <= set(sub.choices), documented - set(sub.choices)


def test_exit_code_table_matches_code():
    from edgedeploy.errors import EXIT_CODES

    for code, meaning in EXIT_CODES.items():
        assert f"| {code} | {meaning} |" in README
