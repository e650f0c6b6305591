"""Content-keyed stage cache: ``<root>/<stage>/<key>/`` holds a stage's files and metrics.

Keys hash the stage's code version, the config fields it reads and the sha256 of
every artifact it consumes; modification times never enter.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgedeploy.fileio.hashing import sha256_file

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
                if sha256_file(d / name) != sha:
                    raise ValueError(name)
        except (OSError, ValueError, KeyError, json.JSONDecodeError):
            shutil.rmtree(d, ignore_errors=True)
            return None
        return CacheEntry(
            files=files,
            metrics=data.get("metrics", {}),
            warnings=tuple(data.get("warnings", ())),
            notes=tuple(data.get("notes", ())),
        )

    def restore(self, stage: str, key: str, entry: CacheEntry, dest: Path) -> None:
        """Copy a cached entry's files into ``dest`` (hard links where the filesystem allows)."""
        d = self._dir(stage, key)
        for name in entry.files:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            _link_or_copy(d / name, target)

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
                _link_or_copy(src / name, tmp / name)
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


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link (no extra disk for large models); copy across filesystems.

    Artifacts are only ever replaced by rename, never edited in place, so a shared
    inode cannot change under the cache; ``lookup`` re-hashes entries anyway.
    """
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
