"""Content hashing used for cache keys and the manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, BinaryIO

_CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    with open(path, "rb") as fh:
        return sha256_open(fh)


def sha256_open(fh: BinaryIO) -> str:
    """Hex sha256 of an open file's bytes from its start, read in chunks."""
    h = hashlib.sha256()
    fh.seek(0)
    while chunk := fh.read(_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def sha256_json(data: Any) -> str:
    """Hex sha256 of a JSON-serialisable value in canonical form (sorted keys)."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
