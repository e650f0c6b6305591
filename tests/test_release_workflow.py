"""The documented release pipeline (.github/workflows/release.yml) and the docs' command lines use only
``deploy`` subcommands and flags that the real CLI parser has, and the workflow is wired train → build →
gate → publish with a self-hosted Jetson job. The parser is built at test time, so commands added later
are checked as they are."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgedeploy.cli import build_parser
from edgedeploy.errors import EXIT_CODES
from edgedeploy.targets.profiles import BUILTIN_TARGETS

yaml = pytest.importorskip("yaml", reason="PyYAML is in the test extra")

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `docker run ... IMAGE args`: our images have `deploy` as entrypoint, so what follows the image is a deploy command.
IMAGE_TOKEN = re.compile(r"edgedeploy:[\w.-]+$|^\$\{?[A-Z_]*IMAGE[A-Z_]*\}?$")
CONTROL = re.compile(r"^[;&|()]+$")
SHELL_KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "time", "exec"}
REDIRECT = re.compile(r"^[<>&]*[<>][<>&]*$")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    return _subparsers_of(build_parser())


def shell_commands(script: str) -> Iterator[list[str]]:
    """Simple commands of a shell script: continuations joined, comments and redirections dropped,
    split at ; && || | ( )."""
    script = re.sub(r"\$\{\{.*?\}\}", "GHA_EXPR", script.replace("\\\n", " "))
    for line in script.splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
        lex.whitespace_split = True
        lex.commenters = "#"
        command: list[str] = []
        tokens = iter(lex)
        for token in tokens:
            if REDIRECT.match(token):
                if command and command[-1].isdigit():
                    command.pop()  # the fd of `2>`
                next(tokens, None)  # the redirection's file (or fd)
            elif CONTROL.match(token):
                if command:
                    yield command
                command = []
            else:
                command.append(token)
        if command:
            yield command


def deploy_invocations(script: str) -> Iterator[list[str]]:
    """The argument lists given to ``deploy`` in a script: ``deploy …``, ``python -m edgedeploy …``
    (also under torchrun) and ``docker run … <edgedeploy image> …``."""
    for cmd in shell_commands(script):
        while cmd and (re.match(r"^[A-Za-z_]\w*=", cmd[0]) or cmd[0] in SHELL_KEYWORDS):
            cmd = cmd[1:]  # leading VAR=value assignments, `then deploy ...`
        if not cmd:
            continue
        if cmd[0] == "deploy":
            yield cmd[1:]
        elif "edgedeploy" in cmd and cmd.index("edgedeploy") > 0 and cmd[cmd.index("edgedeploy") - 1] == "-m":
            yield cmd[cmd.index("edgedeploy") + 1 :]
        elif cmd[:2] == ["docker", "run"]:
            image = next((i for i, tok in enumerate(cmd) if IMAGE_TOKEN.search(tok)), None)
            if image is not None:
                yield cmd[image + 1 :]


def _subparsers_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return dict(action.choices) if action else {}


def check_invocation(args: list[str], where: str, parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """Problems with one ``deploy`` argument list: unknown (nested) subcommand, unknown flag, or a parse error."""
    if not args:
        return [f"{where}: bare 'deploy' with no subcommand"]
    sub = args[0]
    if sub not in parsers:
        return [f"{where}: 'deploy {sub}' is not a subcommand (have: {', '.join(sorted(parsers))})"]
    parser, path, rest = parsers[sub], [sub], args[1:]
    while _subparsers_of(parser) and rest and rest[0] in _subparsers_of(parser):  # e.g. `deploy bundle complete`
        parser, path, rest = _subparsers_of(parser)[rest[0]], [*path, rest[0]], rest[1:]
    command = "deploy " + " ".join(path)
    known = {s for a in parser._actions for s in a.option_strings}
    unknown = [t.split("=")[0] for t in rest if t.startswith("-") and t.split("=")[0] not in known]
    if unknown:
        return [f"{where}: '{command}' has no flag {', '.join(unknown)}"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parsers[sub].parse_args(args[1:])
        except SystemExit as exc:
            if exc.code:
                return [f"{where}: 'deploy {' '.join(args)}' does not parse: {err.getvalue().strip()}"]
    return []


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def workflow_scripts() -> Iterator[tuple[str, str]]:
    for job_name, job in workflow()["jobs"].items():
        for i, step in enumerate(job.get("steps", [])):
            if "run" in step:
                yield f"release.yml jobs.{job_name}.steps[{i}] ({step.get('name', '')})", step["run"]


def doc_scripts() -> Iterator[tuple[str, str]]:
    for doc in DOCS:
        for i, block in enumerate(re.findall(r"```(?:bash|sh|console)\n(.*?)```", doc.read_text(), re.S)):
            yield f"{doc.name} code block {i}", block


# ---- the extractor itself ----------------------------------------------------------------------------------


def test_extractor_finds_every_form_of_deploy_call():
    script = (
        "set -e\n"
        "X=1 deploy build --config a.toml \\\n  --target ${{ matrix.target }} && echo ok  # comment\n"
        "torchrun --nproc_per_node 2 -m edgedeploy train --config t.toml --out run\n"
        'docker run --rm -v "$PWD:/work" "$IMAGE_JETSON" doctor --require jetson-orin\n'
        "docker run --rm ghcr.io/acme/edgedeploy:cpu targets --json | tee t.json\n"
        "deploy doctor --json > doctor.json 2>&1\n"
        "if true; then deploy bundle complete out/b --timing-cache t.cache; fi\n"
        "echo deploy build  # not a call\n"
    )
    assert list(deploy_invocations(script)) == [
        ["build", "--config", "a.toml", "--target", "GHA_EXPR"],
        ["train", "--config", "t.toml", "--out", "run"],
        ["doctor", "--require", "jetson-orin"],
        ["targets", "--json"],
        ["doctor", "--json"],
        ["bundle", "complete", "out/b", "--timing-cache", "t.cache"],
    ]


def test_checker_rejects_unknown_subcommands_flags_and_missing_required_args():
    parsers = subparsers()
    assert check_invocation(["build", "--config", "a.toml", "--target", "cpu"], "w", parsers) == []
    assert "not a subcommand" in check_invocation(["biuld", "--config", "a.toml"], "w", parsers)[0]
    assert "no flag --targt" in check_invocation(["build", "--config", "a.toml", "--targt", "cpu"], "w", parsers)[0]
    assert "does not parse" in check_invocation(["train", "--out", "run"], "w", parsers)[0]  # --config required
    # nested subcommands (`deploy bundle complete`) are resolved before flags are checked
    assert check_invocation(["bundle", "complete", "b", "--timing-cache", "t"], "w", parsers) == []
    assert (
        "no flag --timing-cache" in check_invocation(["bundle", "verify", "b", "--timing-cache", "t"], "w", parsers)[0]
    )


# ---- the workflow -------------------------------------------------------------------------------------------


def test_workflow_uses_only_existing_commands_and_flags():
    parsers = subparsers()
    problems: list[str] = []
    used: set[str] = set()
    for where, script in workflow_scripts():
        for args in deploy_invocations(script):
            problems += check_invocation(args, where, parsers)
            used.add(args[0] if args else "")
    assert not problems, "\n".join(problems)
    assert {"train", "build", "doctor"} <= used, used


def test_docs_command_lines_use_only_existing_commands_and_flags():
    parsers = subparsers()
    problems: list[str] = []
    count = 0
    for where, script in doc_scripts():
        for args in deploy_invocations(script):
            problems += check_invocation(args, where, parsers)
            count += 1
    assert not problems, "\n".join(problems)
    assert count >= 5


def test_workflow_is_wired_train_build_gate_publish():
    wf = workflow()
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` key as boolean True
    assert "push" in triggers and "workflow_dispatch" in triggers
    jobs = wf["jobs"]

    def needs(name: str) -> set[str]:
        value = jobs[name].get("needs", [])
        return {value} if isinstance(value, str) else set(value)

    for name, job in jobs.items():
        assert "runs-on" in job and job.get("steps"), f"job {name} needs runs-on and steps"
        assert needs(name) <= set(jobs), f"job {name} needs an unknown job"
        for step in job["steps"]:
            if "uses" in step:
                assert re.search(r"@v\d+$|@[0-9a-f]{40}$", step["uses"]), f"{name}: pin {step['uses']} to a version"

    def upstream(name: str) -> set[str]:
        seen: set[str] = set()
        todo = list(needs(name))
        while todo:
            job = todo.pop()
            if job not in seen:
                seen.add(job)
                todo += needs(job)
        return seen

    assert "train" in upstream("build")
    assert "build" in upstream("gate")
    assert {"gate", "device"} <= upstream("publish")
    assert "build" in upstream("device")
    device = jobs["device"]
    assert "self-hosted" in device["runs-on"], "the device job runs on a runner inside the device lab"
    # one `deploy device run` completes every TensorRT target's bundle on its own device, then gates and re-signs
    calls = [c for _, script in workflow_scripts() if "device run" in script for c in deploy_invocations(script)]
    (run,) = [c for c in calls if c[:2] == ["device", "run"]]
    hosts = [run[i + 1].split("=", 1)[0] for i, token in enumerate(run) if token == "--host"]
    assert sorted(hosts) == ["desktop", "jetson-orin"] and {"out/jetson-orin", "out/desktop"} <= set(run)
    steps = " ".join(step.get("run", "") for step in device["steps"])
    assert steps.index("deploy device run") < steps.index("deploy gate") < steps.index("deploy sign")
    assert 'required_backends = ["tensorrt"]' in steps

    matrix = jobs["build"]["strategy"]["matrix"]["target"]
    assert set(matrix) == {"cpu", "jetson-orin", "desktop"}
    assert set(matrix) <= set(BUILTIN_TARGETS)


def test_workflow_gate_policies_are_valid_policies(tmp_path: Path):
    """Run the workflow's policy step for real and load what it writes with the gate's own loader."""
    import subprocess

    from edgedeploy.validate.gate import load_policy

    gate = workflow()["jobs"]["gate"]
    script = next(step["run"] for step in gate["steps"] if step.get("name") == "Gate policies")
    subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=tmp_path, check=True, timeout=30)
    policies = {
        entry["target"]: load_policy(tmp_path / entry["policy"]) for entry in gate["strategy"]["matrix"]["include"]
    }
    assert set(policies) == {"cpu", "jetson-orin", "desktop"}
    assert set(policies["cpu"].required_checks) == {"integrity", "parity", "batch_consistency"}
    assert policies["cpu"].max_latency_regression_pct == 15.0
    # device bundles carry no engine yet: parity is the device job's, integrity is gated here
    assert policies["jetson-orin"].required_checks == policies["desktop"].required_checks == ("integrity",)


def test_workflow_publishes_manifest_and_reports():
    text = WORKFLOW.read_text()
    for needle in ("manifest.json", "report.json"):
        assert needle in text, f"release.yml should publish {needle}"


# ---- docs/release.md ----------------------------------------------------------------------------------------


def test_release_doc_lists_every_exit_code():
    doc = (ROOT / "docs" / "release.md").read_text()
    rows = dict(re.findall(r"^\|\s*(\d+)\s*\|\s*([^|]+?)\s*\|", doc, re.M))
    assert {int(k) for k in rows} == set(EXIT_CODES), "docs/release.md exit-code table is out of date"
