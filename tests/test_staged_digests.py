"""A build hashes each version of a staging file once: the digest is remembered with the file's stat signature
(a rewrite, even of the same size, is hashed again), forgotten when a stage writes or restores the file, and a
cache restore's verified digests are taken as they are."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import write_unique_tiny_project

from edgedeploy.fileio.hashing import sha256_bytes


def _context(tmp_path: Path) -> Any:
    from edgedeploy.config import load_config
    from edgedeploy.stages.base import BuildContext
    from edgedeploy.targets import get_target

    cfg = load_config(write_unique_tiny_project(tmp_path / "proj"))
    staging = tmp_path / "staging"
    staging.mkdir()
    return BuildContext(cfg=cfg, target=get_target("cpu"), staging=staging, out=tmp_path / "out")


def _counting(monkeypatch: pytest.MonkeyPatch) -> Counter:
    import edgedeploy.stages.base as base

    counts: Counter = Counter()
    real = base.sha256_file

    def counted(path: Any) -> str:
        counts[Path(path).name] += 1
        return real(path)

    monkeypatch.setattr(base, "sha256_file", counted)
    return counts


def test_a_staging_file_is_hashed_once_per_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _context(tmp_path)
    counts = _counting(monkeypatch)
    f = ctx.staging / "model.onnx"
    f.write_bytes(b"a" * 64)
    assert ctx.sha256("model.onnx") == ctx.sha256("model.onnx") == sha256_bytes(b"a" * 64)
    assert counts["model.onnx"] == 1
    # the same size and modification time written back: the status-change time still tells
    stat = f.stat()
    time.sleep(0.05)
    f.write_bytes(b"b" * 64)
    os.utime(f, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert ctx.sha256("model.onnx") == sha256_bytes(b"b" * 64)
    assert counts["model.onnx"] == 2
    ctx.forget_digests(["model.onnx"])
    assert ctx.sha256("model.onnx") == sha256_bytes(b"b" * 64)
    assert counts["model.onnx"] == 3
    ctx.remember_digest("model.onnx", "0" * 64)  # what a cache restore verified is taken as it is
    assert ctx.sha256("model.onnx") == "0" * 64 and counts["model.onnx"] == 3


def test_a_fully_cached_build_hashes_no_restored_file_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgedeploy.config import load_config
    from edgedeploy.pipeline.runner import run_build

    cfg = load_config(write_unique_tiny_project(tmp_path / "proj"))
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(tmp_path / "cache"))
    cold = _counting(monkeypatch)
    run_build(cfg, log=lambda _: None)
    assert cold["model.onnx"] == 1  # every stage after export reads the one digest
    warm = _counting(monkeypatch)
    result = run_build(cfg, log=lambda _: None)
    assert {s.status for s in result.stages} <= {"cached", "skipped"}
    restored = {"model.onnx", "model.ts", "goldens.npz"}
    assert not restored & set(warm), warm  # their restores checked them: nothing hashes them again
    assert all(n == 1 for n in warm.values()), warm  # the report files written at the end: once each
