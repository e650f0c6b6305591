"""Content-keyed stage cache: ``<root>/<stage>/<key>/`` holds a stage's files and metrics.

Keys hash the stage's code version, the config fields it reads and the sha256 of
every artifact it consumes; modification times never enter.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgedeploy.errors import ArtifactIntegrityError
from edgedeploy.fileio.hashing import sha256_file
from edgedeploy.fileio.outdir import clone_or_copy, confined

_RECORD = "stage.json"


@dataclass(frozen=True)
class CacheEntry:
    files: dict[str, str]  # artifact name -> sha256
    metrics: dict[str, Any]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


class StageCache:
    """A folder of finished stage results, looked up by content key."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def lookup(self, stage: str, key: str) -> CacheEntry | None:
        """The entry for ``key``, or None when absent or damaged (a damaged entry is dropped)."""
        d = self._dir(stage, key)
        record = d / _RECORD
        if not record.is_file():
            return None
        try:
            data = json.loads(record.read_text())
            files = data["files"]
            for name, sha in files.items():
                if sha256_file(confined(d, name, "cache entry")) != sha:
                    raise ValueError(name)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, json.JSONDecodeError, ArtifactIntegrityError):
            shutil.rmtree(d, ignore_errors=True)
            return None
        os.utime(record)  # last use, for prune (least recently used goes first)
        return CacheEntry(
            files=files,
            metrics=data.get("metrics", {}),
            warnings=tuple(data.get("warnings", ())),
            notes=tuple(data.get("notes", ())),
        )

    def restore(self, stage: str, key: str, entry: CacheEntry, dest: Path) -> None:
        """Copy a cached entry's files into ``dest`` (reflinks where the filesystem allows; never hard links)."""
        d = self._dir(stage, key)
        for name in entry.files:
            target = confined(dest, name, "cache entry")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            clone_or_copy(confined(d, name, "cache entry"), target)

    def store(
        self,
        stage: str,
        key: str,
        src: Path,
        files: list[str],
        metrics: dict[str, Any],
        *,
        warnings: list[str] | tuple[str, ...] = (),
        notes: list[str] | tuple[str, ...] = (),
    ) -> None:
        """Save a stage's outputs and whole result under ``key``; written to a temp folder and renamed into place."""
        final = self._dir(stage, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}.", dir=final.parent))
        try:
            shas = {}
            for name in files:
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                clone_or_copy(src / name, tmp / name)
                shas[name] = sha256_file(tmp / name)
            (tmp / _RECORD).write_text(
                json.dumps(
                    {"files": shas, "metrics": metrics, "warnings": list(warnings), "notes": list(notes)}, default=str
                )
            )
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def entries(self) -> list[tuple[Path, int, float]]:
        """Every entry as (folder, bytes, last use), least recently used first."""
        rows = []
        for record in self.root.glob(f"*/*/{_RECORD}"):
            folder = record.parent
            try:
                size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
                rows.append((folder, size, record.stat().st_mtime))
            except OSError:
                continue
        return sorted(rows, key=lambda r: r[2])

    def prune(self, max_bytes: int) -> tuple[int, int]:
        """Delete least recently used entries until the cache holds at most ``max_bytes``.

        Returns (entries removed, bytes freed). Half-written temp folders are removed too.
        """
        for tmp in self.root.glob("*/.*"):
            if tmp.is_dir() and time.time() - tmp.stat().st_mtime > 3600:  # a store killed midway
                shutil.rmtree(tmp, ignore_errors=True)
        rows = self.entries()
        total = sum(r[1] for r in rows)
        removed = freed = 0
        for folder, size, _ in rows:
            if total <= max_bytes:
                break
            shutil.rmtree(folder, ignore_errors=True)
            total -= size
            removed += 1
            freed += size
        return removed, freed


MAX_SIZE_ENV = "EDGEDEPLOY_CACHE_MAX_SIZE"
DEFAULT_MAX_SIZE = "10G"


def parse_size(text: str) -> int:
    """Bytes from ``"500M"``, ``"10G"``, ``"1.5T"`` or a plain number of bytes.

    Raises:
        ValueError: not a size.
    """
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    number = float(t[:-1] if t[-1:] in "KMGT" and t else t)
    if not number >= 0 or number == float("inf"):
        raise ValueError(text)
    return int(number * scale)


def max_cache_bytes() -> int:
    """The cache bound: ``$EDGEDEPLOY_CACHE_MAX_SIZE`` (e.g. ``20G``), else 10 GiB.

    Raises:
        ConfigError: the variable is not a size.
    """
    from edgedeploy.errors import ConfigError

    text = os.environ.get(MAX_SIZE_ENV) or DEFAULT_MAX_SIZE
    try:
        return parse_size(text)
    except ValueError:
        raise ConfigError(f"{MAX_SIZE_ENV}={text!r} is not a size", hint="e.g. 500M, 10G") from None
