"""Atomic file writes and publishing a finished build into the output directory."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _umask_mode())  # mkstemp creates 0600; artifacts get the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def publish(staging: Path, out: Path, files: Iterable[str], stale: Iterable[str] = ()) -> None:
    """Move finished files from ``staging`` into ``out``, each with an atomic rename.

    ``stale`` names files of the previous build that this build no longer makes;
    they are removed after the new files are in place. Files are moved in the
    given order, so callers pass the manifest last: a reader never sees a
    manifest that names files not yet published.
    """
    out.mkdir(parents=True, exist_ok=True)
    names = list(files)
    for name in names:
        dst = out / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / name, dst)
    for name in stale:
        if name not in names:
            (out / name).unlink(missing_ok=True)
