"""README stays true: generated tables current, set-up commands present, documented commands exist."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_generated_tables_are_current():
    res = subprocess.run([sys.executable, "tools/update_readme.py", "--check"], cwd=ROOT, timeout=120)
    assert res.returncode == 0, "README.md is stale: run `python tools/update_readme.py`"


def _readme_commands():
    spec = importlib.util.spec_from_file_location("readme_commands", ROOT / ".ci" / "readme_commands.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_exactly_two_setup_commands_and_their_files_exist():
    setup = README.split("## Set-up commands", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)\n```", setup, flags=re.S)
    assert len(blocks) == 2
    demo, tests = blocks
    assert "deploy build" in demo and "pytest" in tests
    for path in re.findall(r"(examples/\S+\.(?:py|toml))", demo):
        assert (ROOT / path).is_file(), path
    # the demo installs what a user needs, the tests what the tests need (the `test` extra)
    assert "pip install -e . " in demo and "'.[test]'" in tests


def test_ci_runs_the_readme_commands_verbatim():
    """`.ci/run`'s fast job runs exactly the README's two commands, each in a fresh venv, and nothing in their place."""
    commands = _readme_commands().setup_commands(README)
    setup = README.split("## Set-up commands", 1)[1].split("\n## ", 1)[0]
    assert [commands["demo"], commands["tests"]] == re.findall(r"```bash\n(.*?)\n```", setup, flags=re.S)
    ci = (ROOT / ".ci" / "run").read_text()
    fast = ci.rsplit("\nfi\n", 1)[1]  # after the --containers and --slow branches
    assert "demo=$(python3 .ci/readme_commands.py demo)" in fast
    assert "tests=$(python3 .ci/readme_commands.py tests)" in fast
    run_demo, run_tests = fast.index('-c "$demo"'), fast.index('-c "$tests"')
    assert fast.index("rm -rf .venv") < run_demo < fast.index("rm -rf .venv", run_demo) < run_tests
    assert "pytest" not in fast.replace("readme_commands.py tests", ""), "CI runs a test command of its own"
    assert "-m pytest -n auto -m slow" in ci


def test_readme_commands_refuses_a_third_block():
    module = _readme_commands()
    with pytest.raises(SystemExit, match="exactly two"):
        module.setup_commands("## Set-up commands\n```bash\na\n```\n```bash\nb\n```\n```bash\nc\n```\n")


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
