"""sha256 digests remembered across builds for files that have not changed since they were hashed.

A fully cached build would otherwise hash its model checkpoint and every artifact it restores from the stage
cache again (about 0.1 s per 90 MB). A digest is remembered with the file's identity: device, inode, size,
modification and status-change times in nanoseconds. No file owner can set a status-change time: every write,
truncation, rename, chmod or ``utime`` moves it to the current time. So a file showing a remembered identity
holds the bytes that were hashed, provided that time already lay in the past when they were read: file times
advance in coarse ticks, and a write within the tick of the last change could leave the time as it was. A
digest is therefore remembered only for a file whose status-change time is at least :data:`SETTLED_S` old.

The memo is one JSON file with an HMAC-SHA256 over its entries, made with the stage cache's per-user secret:
whoever can write the folder it lives in can delete it (files are then hashed again) but cannot add or change
an entry. A memo that does not verify is ignored and rewritten.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import tempfile
import time
from pathlib import Path

from edgedeploy.fileio.hashing import sha256_open

SETTLED_S = 2.0  # a file whose status changed less recently than this is hashed, never remembered
MAX_ENTRIES = 256  # the most recently remembered files are kept
_SCHEMA = "edgedeploy-digests/1"

Identity = tuple[int, int, int, int, int]  # device, inode, size, mtime_ns, ctime_ns


def identity(st: os.stat_result) -> Identity:
    """What must be unchanged for a remembered digest to hold: device, inode, size, mtime and ctime (ns)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class DigestMemo:
    """Remembered sha256 digests, keyed by file identity, kept in ``path`` under an HMAC with ``secret``.

    Without a path or a secret nothing persists: every file is hashed, as before there was a memo.
    """

    def __init__(self, path: Path | None = None, secret: bytes | None = None) -> None:
        self.path = path if secret else None
        self._secret = secret or b""
        self._entries: dict[str, list[int | str]] | None = None  # "dev:ino" -> [size, mtime, ctime, sha, when]
        self._dirty = False

    def _mac(self, entries: dict[str, list[int | str]]) -> str:
        blob = json.dumps({"schema": _SCHEMA, "entries": entries}, sort_keys=True, separators=(",", ":"))
        return hmac.new(self._secret, blob.encode(), hashlib.sha256).hexdigest()

    def _load(self) -> dict[str, list[int | str]]:
        if self._entries is not None:
            return self._entries
        self._entries = {}
        if self.path is None:
            return self._entries
        try:
            with open(self.path, "rb", opener=no_follow) as fh:
                data = json.loads(fh.read(1 << 22))
            entries = data["entries"]
            if isinstance(entries, dict) and hmac.compare_digest(str(data.get("mac", "")), self._mac(entries)):
                self._entries = entries
        except (OSError, ValueError, TypeError, KeyError):
            pass  # absent, unreadable or forged: start empty
        return self._entries

    def known(self, st: os.stat_result) -> str | None:
        """The remembered sha256 of the file with stat ``st``, when its identity is exactly the one hashed."""
        row = self._load().get(f"{st.st_dev}:{st.st_ino}")
        if not isinstance(row, list) or len(row) != 5 or row[:3] != [st.st_size, st.st_mtime_ns, st.st_ctime_ns]:
            return None
        return str(row[3])

    def remember(self, st: os.stat_result, sha: str) -> None:
        """Remember ``sha`` for the file with stat ``st`` (taken before its bytes were read and unchanged after),
        unless its status changed less than :data:`SETTLED_S` ago."""
        now = time.time_ns()
        if self.path is None or now - st.st_ctime_ns < SETTLED_S * 1e9:
            return
        entries = self._load()
        entries[f"{st.st_dev}:{st.st_ino}"] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha, now]
        if len(entries) > MAX_ENTRIES:
            for key in sorted(entries, key=lambda k: int(entries[k][4]))[: len(entries) - MAX_ENTRIES]:
                del entries[key]
        self._dirty = True

    def sha256(self, path: Path) -> str:
        """sha256 of the file at ``path``: remembered when the file is exactly as hashed before, else hashed
        (and remembered when it did not change while it was read).

        Raises:
            OSError: the file cannot be opened or read.
        """
        with open(path, "rb") as fh:
            before = os.fstat(fh.fileno())
            sha = self.known(before)
            if sha is not None:
                return sha
            sha = sha256_open(fh)
            if identity(os.fstat(fh.fileno())) == identity(before):
                self.remember(before, sha)
        return sha

    def save(self) -> None:
        """Write the memo when it changed (a temp file renamed over it, mode 0600); a write that fails is
        dropped: the next build hashes again."""
        if not self._dirty or self.path is None or self._entries is None:
            return
        self._dirty = False
        body = {"schema": _SCHEMA, "entries": self._entries, "mac": self._mac(self._entries)}
        try:
            fd, tmp = tempfile.mkstemp(prefix=".digests.", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as fh:
                    json.dump(body, fh, separators=(",", ":"))
                os.replace(tmp, self.path)
            except OSError:
                os.unlink(tmp)
                raise
        except OSError:
            pass


def no_follow(path: str, flags: int) -> int:
    """An ``opener`` for :func:`open` that refuses a link as the last path component (O_NOFOLLOW)."""
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))
