"""A build whose stages are all cached imports neither the user's model module nor PyTorch (each run in a
fresh process, as the CLI runs): the model code's files are remembered (pipeline/code_memo.py) and checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgedeploy.pipeline.code_memo import CodeMemo, tree_digest

DRIVER = """
import json, os, sys, time
t0 = time.perf_counter()
import edgedeploy
result = edgedeploy.build(sys.argv[1], log=lambda line: None)
print(json.dumps({
    "torch": "torch" in sys.modules,
    "user_module": any(name.startswith("edgedeploy_user_") for name in sys.modules),
    "stages": {s.name: s.status for s in result.stages},
    "seconds": time.perf_counter() - t0,
    "thread_waits": [os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT")],
}))
"""


def _build(cfg: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}  # the build's own
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(cfg)], capture_output=True, text=True, cwd=cfg.parent, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_fully_cached_build_imports_no_torch_and_a_new_project_module_imports_it_again(tiny_project: Path):
    cold = _build(tiny_project)
    assert cold["torch"] and set(cold["stages"].values()) <= {"ran", "skipped"}
    # set before the model code imported torch (bounded_thread_waits leaves them unset once torch is loaded)
    assert cold["thread_waits"] in ([None, "10000"], ["PASSIVE", None])
    cached = _build(tiny_project)
    assert not cached["torch"] and not cached["user_module"], "a fully cached build imported torch / the model"
    assert set(cached["stages"].values()) <= {"cached", "skipped"}, cached["stages"]
    # a new module in the project could shadow an import: the model module is imported again, the cache
    # entries still hit (same files), and the list is remembered again
    (tiny_project.parent / "helper.py").write_text("SCALE = 1.0\n")
    shadow = _build(tiny_project)
    assert shadow["torch"] and shadow["user_module"]
    assert set(shadow["stages"].values()) <= {"cached", "skipped"}, shadow["stages"]
    assert not _build(tiny_project)["torch"]


def test_memo_is_ignored_when_a_file_it_names_changed_or_it_is_damaged_or_forged(tmp_path: Path):
    from edgedeploy.pipeline.cache import StageCache

    root = tmp_path / "proj"
    root.mkdir()
    model = root / "net.py"
    model.write_text("X = 1\n")
    cache = StageCache(tmp_path / "cache", log=lambda line: None)
    memo = CodeMemo(cache, "k", (root,))
    assert memo.recall() is None  # nothing remembered yet
    memo.remember((model,))
    assert memo.recall() == (model,)
    model.write_text("X = 2\n")  # same file list, other contents: never trusted
    assert memo.recall() is None
    memo.remember((model,))
    (stored,) = (tmp_path / "cache").rglob(f"{memo.name}.json")
    envelope = json.loads(stored.read_text())
    data = json.loads(envelope["text"])
    data["files"] = []  # a list that leaves the model's file out, written by someone without the cache's key
    envelope["text"] = json.dumps(data)
    stored.write_text(json.dumps(envelope))
    assert memo.recall() is None
    stored.write_text("{not json")
    assert memo.recall() is None


@pytest.mark.parametrize("name", ["__pycache__", ".venv", "site-packages"])
def test_tree_digest_covers_project_python_files_only(tmp_path: Path, name: str):
    (tmp_path / "a.py").write_text("A = 1\n")
    before = tree_digest([tmp_path])
    (tmp_path / name).mkdir()
    (tmp_path / name / "b.py").write_text("B = 1\n")
    assert tree_digest([tmp_path]) == before
    (tmp_path / "c.py").write_text("C = 1\n")
    assert tree_digest([tmp_path]) != before


def test_the_memo_follows_where_imports_resolve(tmp_path: Path):
    """A module the model imports from PYTHONPATH: with another folder there, the memo's file list (which names
    the first folder's module) is not trusted, the model code is read again, and the stages run."""
    from conftest import write_unique_tiny_project

    cfg = write_unique_tiny_project(tmp_path / "proj")
    module = next(p for p in cfg.parent.glob("tinynet_*.py"))
    module.write_text("from extscale import SCALE  # noqa: F401\n" + module.read_text())
    for name, scale in (("hA", 1.0), ("hB", 2.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "extscale.py").write_text(f"SCALE = {scale}\n")
    runs = {}
    for name in ("hA", "hA", "hB"):
        os.environ["PYTHONPATH"], before = str(tmp_path / name), os.environ.get("PYTHONPATH")
        try:
            runs.setdefault(name, []).append(_build(cfg))
        finally:
            os.environ.pop("PYTHONPATH") if before is None else os.environ.__setitem__("PYTHONPATH", before)
    assert not runs["hA"][1]["user_module"]  # the same folders: remembered
    assert runs["hB"][0]["user_module"], "the memo named hA's extscale.py while hB's is the one imported"
