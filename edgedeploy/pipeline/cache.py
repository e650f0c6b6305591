"""Content-keyed stage cache: ``<root>/<stage>/<key>/`` holds a stage's files and metrics.

Keys hash the stage's code version, the config fields it reads, the sha256 of
every artifact it consumes and the Python environment (the interpreter and every installed package's
version, :mod:`edgedeploy.fileio.environment`); modification times never enter.

The cache cannot vouch for itself: anyone who can write its folder can rewrite an artifact and
every hash beside it. So each entry's record carries an HMAC-SHA256 over the stage, the key, every
file's sha256 and the stage's result, made with a per-user secret kept outside the cache
(``$EDGEDEPLOY_CACHE_KEY``, else ``<config>/edgedeploy/cache.key``, created 0600 on first use). An
entry whose HMAC does not verify is rebuilt, never used; a cache folder that is a link, belongs to
another user, or that group or others may write is not used at all (one console line each). Restored
files are hashed after the copy, so a file swapped between the check and the copy is caught too, unless the
digest memo (``digests.json``, :mod:`edgedeploy.fileio.digest_memo`, under the same secret) vouches for the
very inode copied: hashed before with that sha256, and its status unchanged since and during the copy.

Only what the cache made is deleted: entries are real folders holding a ``stage.json`` directly
inside the cache's real folder; links are never followed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgedeploy.errors import ArtifactIntegrityError
from edgedeploy.fileio.digest_memo import DigestMemo, identity, no_follow
from edgedeploy.fileio.hashing import sha256_file
from edgedeploy.fileio.outdir import clone_or_copy, clone_or_copy_open, confined
from edgedeploy.jsonread import read_json

_RECORD = "stage.json"
_SCHEMA = "edgedeploy-cache/2"
_TAG = "CACHEDIR.TAG"  # https://bford.info/cachedir/: backup tools skip the folder
_TAG_TEXT = "Signature: 8a477f597d28d172789f06886806bc55\n# edgedeploy stage cache (deploy cache prune)\n"
_TEMP = re.compile(r"^\.[0-9a-f]{12}\.[A-Za-z0-9_]+$")  # a store's temp folder (tempfile.mkdtemp)
_PLOTS = "plots"

CACHE_ENV = "EDGEDEPLOY_CACHE_DIR"
KEY_ENV = "EDGEDEPLOY_CACHE_KEY"
KEY_FILE = "cache.key"
DIGESTS_FILE = "digests.json"  # the digest memo (fileio.digest_memo), authenticated with the cache key


@dataclass(frozen=True)
class CacheEntry:
    files: dict[str, str]  # artifact name -> sha256
    metrics: dict[str, Any]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _home_dir(env: str, fallback: str) -> Path:
    value = os.environ.get(env, "")
    if value and os.path.isabs(value):  # the XDG rule: a relative value is ignored
        return Path(value)
    try:
        return Path.home() / fallback
    except (RuntimeError, KeyError):  # no home (a container user without a passwd entry): the cache is not used
        return Path("/nonexistent") / fallback


def default_cache_dir() -> Path:
    """``$EDGEDEPLOY_CACHE_DIR``, else ``$XDG_CACHE_HOME/edgedeploy``, else ``~/.cache/edgedeploy``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    return _home_dir("XDG_CACHE_HOME", ".cache") / "edgedeploy"


def key_file() -> Path:
    """Where the per-user cache secret lives: ``$XDG_CONFIG_HOME/edgedeploy/cache.key`` (else ``~/.config``)."""
    return _home_dir("XDG_CONFIG_HOME", ".config") / "edgedeploy" / KEY_FILE


def _my_uid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None


def _real_dir(path: str) -> bool:
    """A folder, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _distrust(st: os.stat_result) -> str | None:
    """``link``, ``owner`` or ``mode``: why a folder or file with this ``lstat`` cannot be trusted (None: it can)."""
    uid = _my_uid()
    if stat.S_ISLNK(st.st_mode):
        return "link"
    if uid is not None and st.st_uid != uid:
        return "owner"
    if uid is not None and st.st_mode & 0o022:
        return "mode"
    return None


def _unsafe(st: os.stat_result, what: str) -> str | None:
    """Why a folder or file with this ``lstat`` cannot be trusted, in words (None: it can)."""
    why = {
        "link": f"{what} is a link",
        "owner": f"{what} belongs to another user (uid {st.st_uid})",
        "mode": f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})",
    }
    kind = _distrust(st)
    return why[kind] if kind else None


def cache_secret() -> bytes:
    """The HMAC secret: ``$EDGEDEPLOY_CACHE_KEY`` (e.g. a CI secret), else the per-user key file.

    The file is created on first use (32 random bytes, hex, mode 0600, by an exclusive link so two
    builds starting together agree on one).

    Raises:
        OSError: the key file cannot be created or read, or is not private to this user (the message says which).
    """
    given = os.environ.get(KEY_ENV)
    if given:
        return given.encode()
    path = key_file()
    if not path.exists() and not path.is_symlink():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=f".{KEY_FILE}.", dir=path.parent)  # 0600
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32) + "\n")
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another build made it first: use theirs
        finally:
            os.unlink(tmp)
    st = os.lstat(path)
    problem = _unsafe(st, f"cache key {path}")
    if problem is None and not stat.S_ISREG(st.st_mode):
        problem = f"cache key {path} is not a file"
    if problem is None and st.st_mode & 0o077 and _my_uid() is not None:
        problem = f"cache key {path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}; chmod 600 it)"
    if problem:
        raise OSError(problem)
    text = path.read_text().strip()
    if len(text) < 32:
        raise OSError(f"cache key {path} is too short (delete it: a new one is made)")
    return text.encode()


def _mac(secret: bytes, stage: str, key: str, record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "mac"}
    blob = json.dumps({"stage": stage, "key": key, "record": body}, sort_keys=True, separators=(",", ":"))
    return hmac.new(secret, blob.encode(), hashlib.sha256).hexdigest()


def _folder_fix(root: Path) -> str:
    """What makes ``root`` usable as the cache folder, from what is wrong with it: mode bits a chmod fixes, else
    another folder (a link, another user's folder, a file, one that cannot be made)."""
    if os.environ.get(CACHE_ENV):
        elsewhere = f"point {CACHE_ENV} at another folder of yours"
    else:
        elsewhere = f"set {CACHE_ENV} to a folder of yours"
    try:
        st = os.lstat(root)
    except OSError:  # it could not be made (a parent that is not writable, a file in the way)
        return f"{elsewhere} (mkdir -m 700 DIR)"
    kind = _distrust(st)
    if kind == "link":
        return f"{elsewhere} that is not a link (mkdir -m 700 DIR)"
    if kind == "owner":
        return f"{elsewhere} (mkdir -m 700 DIR): {root} is not yours to fix"
    if kind == "mode":
        return f"chmod 700 {root}"
    return f"{elsewhere} (mkdir -m 700 DIR)"


def _key_fix(path: Path) -> str:
    """What makes the cache key file usable, from what is wrong with it."""
    try:
        st = os.lstat(path)
    except OSError:
        return f"make {path.parent} a folder of yours (mkdir -m 700 {path.parent}), or set {KEY_ENV}"
    uid = _my_uid()
    if stat.S_ISREG(st.st_mode) and (uid is None or st.st_uid == uid) and st.st_mode & 0o077:
        return f"chmod 600 {path}"
    return f"delete {path} (the next build makes a new one), or set {KEY_ENV}"


class StageCache:
    """A folder of finished stage results, looked up by content key and used only when authenticated."""

    def __init__(
        self,
        root: Path,
        *,
        secret: bytes | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.log = log
        self._secret = secret
        self._problem: str | None = None
        self._checked = False
        self._memo: DigestMemo | None = None

    # ---- trust ----------------------------------------------------------------------------------------
    def _say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)

    def problem(self) -> str | None:
        """Why this cache is not used (None: it is). Creates the folder (0700) and the key on first use."""
        if self._checked:
            return self._problem
        self._checked = True
        fix = None
        try:
            if not self.root.exists() and not self.root.is_symlink():
                self.root.mkdir(parents=True, mode=0o700)
                (self.root / _TAG).write_text(_TAG_TEXT)
            self._problem = _unsafe(os.lstat(self.root), f"cache folder {self.root}")
            if self._problem is None and not self.root.is_dir():
                self._problem = f"cache folder {self.root} is not a folder"
            if self._problem is None and not any(self.root.iterdir()):  # a folder made for it (mkdir -m 700)
                (self.root / _TAG).write_text(_TAG_TEXT)
            if self._problem is None and self._secret is None:
                fix = _key_fix(key_file())  # the folder is fine: what fails from here on is the key
                self._secret = cache_secret()
        except OSError as exc:
            self._problem = str(exc) if not exc.strerror else f"{exc.filename or self.root}: {exc.strerror}"
        if self._problem:
            # "warning:" keeps the line under -q: a build that silently caches nothing is worth knowing about
            fix = fix or _folder_fix(self.root)
            self._say(f"warning: stage cache not used: {self._problem}; every stage runs -- fix: {fix}")
        return self._problem

    def _entry_problem(self, d: Path) -> str | None:
        for path, what in ((d.parent, "stage folder"), (d, "entry"), (d / _RECORD, "record")):
            try:
                problem = _unsafe(os.lstat(path), what)
            except OSError:
                return "missing"
            if problem:
                return problem
        return None

    def _dir(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    # ---- use ------------------------------------------------------------------------------------------
    def lookup(self, stage: str, key: str) -> CacheEntry | None:
        """The entry for ``key`` when its record is authenticated; None when absent, damaged or forged."""
        if self.problem():
            return None
        d = self._dir(stage, key)
        if not (d / _RECORD).is_file():
            return None
        why = self._entry_problem(d)
        data: Any = None
        if why is None:
            try:
                data = json.loads((d / _RECORD).read_text())
                if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
                    why = "unreadable record"
                elif not isinstance(data.get("mac"), str) or not hmac.compare_digest(
                    data["mac"], _mac(self._secret or b"", stage, key, data)
                ):
                    why = "not authenticated by this user's cache key"
                else:
                    for name in data["files"]:
                        confined(d, name, "cache entry")
            except (OSError, ValueError, TypeError, ArtifactIntegrityError):
                why = why or "unreadable record"
        if why is not None:
            self._say(f"cache entry {stage}/{key[:12]} ignored ({why}); the stage runs again")
            if why != "missing":
                self._drop(d)
            return None
        os.utime(d / _RECORD)  # last use, for prune (least recently used goes first)
        return CacheEntry(
            files=dict(data["files"]),
            metrics=data.get("metrics", {}),
            warnings=tuple(data.get("warnings", ())),
            notes=tuple(data.get("notes", ())),
        )

    def restore(self, stage: str, key: str, entry: CacheEntry, dest: Path) -> bool:
        """Copy an entry's files into ``dest`` (reflinks where possible; never hard links), each copy checked
        against the authenticated sha256. False (and nothing left in ``dest``) when one differs.

        A copy is hashed unless it came from a file the digest memo (:meth:`digests`) vouches for: the same
        inode, unchanged since it was last hashed with that sha256, and unchanged while it was copied."""
        d = self._dir(stage, key)
        memo = self.digests()
        written = []
        try:
            for name, sha in entry.files.items():
                src = confined(d, name, "cache entry")
                if src.is_symlink() or not src.is_file():
                    raise ValueError(name)
                target = confined(dest, name, "cache entry")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.unlink(missing_ok=True)
                written.append(target)
                with open(src, "rb", opener=no_follow) as fs:
                    before = os.fstat(fs.fileno())
                    clone_or_copy_open(fs, target)
                    steady = identity(os.fstat(fs.fileno())) == identity(before)
                if steady and memo.known(before) == sha:
                    continue  # these very bytes hashed to ``sha`` before, and nothing has touched them since
                if sha256_file(target) != sha:
                    raise ValueError(name)
                if steady:  # the copy is the source's bytes as they were: the source hashes to ``sha``
                    memo.remember(before, sha)
        except (OSError, ValueError, ArtifactIntegrityError) as exc:
            for target in written:
                target.unlink(missing_ok=True)
            self._say(f"cache entry {stage}/{key[:12]} ignored ({exc} differs from its record); the stage runs again")
            self._drop(d)
            return False
        return True

    def digests(self) -> DigestMemo:
        """The per-user digest memo in this cache's folder, authenticated with the cache key (one per cache
        object; :meth:`DigestMemo.save` writes it). Where the cache is not used, a memo that keeps nothing."""
        if self._memo is None:
            usable = self.problem() is None and self._secret is not None
            self._memo = DigestMemo(self.root / DIGESTS_FILE, self._secret) if usable else DigestMemo()
        return self._memo

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
        if self.problem():
            return
        final = self._dir(stage, key)
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if _unsafe(os.lstat(final.parent), "stage folder"):
            return
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}.", dir=final.parent))
        try:
            shas = {}
            for name in files:
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                clone_or_copy(src / name, tmp / name)
                shas[name] = sha256_file(tmp / name)
            # the record as it will read back (json turns tuples into lists, unknown types into str)
            record = json.loads(
                json.dumps(
                    {
                        "schema": _SCHEMA,
                        "files": shas,
                        "metrics": metrics,
                        "warnings": list(warnings),
                        "notes": list(notes),
                    },
                    default=str,
                )
            )
            record["mac"] = _mac(self._secret or b"", stage, key, record)
            (tmp / _RECORD).write_text(json.dumps(record))
            self._drop(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    # ---- small authenticated text memos (report plots, the model code's file list) --------------------------
    def read_memo(self, name: str) -> str | None:
        """A memo written by :meth:`write_memo`, or None when absent or not authenticated."""
        if self.problem():
            return None
        path = self.root / _PLOTS / f"{name}.json"
        try:
            if _unsafe(os.lstat(path), "memo"):
                return None
            data = json.loads(path.read_text(encoding="utf-8"))
            text = data["text"]
            if isinstance(text, str) and hmac.compare_digest(
                str(data["mac"]), _mac(self._secret or b"", _PLOTS, name, {"text": text})
            ):
                return text
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return None

    def write_memo(self, name: str, text: str) -> None:
        if self.problem():
            return
        from edgedeploy.fileio.store import atomic_write_text

        mac = _mac(self._secret or b"", _PLOTS, name, {"text": text})
        folder = self.root / _PLOTS
        folder.mkdir(exist_ok=True, mode=0o700)
        atomic_write_text(folder / f"{name}.json", json.dumps({"text": text, "mac": mac}))

    # ---- bounding -------------------------------------------------------------------------------------
    def _real_root(self) -> Path:
        """The cache folder, refused when it is a link or belongs to someone else (nothing is deleted then).

        Raises:
            InputError: the folder is a link, another user's, or writable by group or others.
        """
        from edgedeploy.errors import InputError

        try:
            st = os.lstat(self.root)
        except OSError:
            return self.root.resolve()
        problem = _unsafe(st, f"cache folder {self.root}")
        if problem is None and not stat.S_ISDIR(st.st_mode):
            problem = f"cache folder {self.root} is not a folder"
        if problem:
            raise InputError(
                f"not pruning {self.root}: {problem}; only a cache folder of yours is cleaned",
                hint=f"point --dir (or {CACHE_ENV}) at the real cache folder",
            )
        return self.root.resolve()

    def _drop(self, folder: Path) -> None:
        """Delete one entry folder: a real folder directly in a stage folder of this cache (links are unlinked)."""
        try:
            st = os.lstat(folder)
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            folder.unlink(missing_ok=True)
            return
        real = self.root.resolve()
        if folder.resolve().parent.parent != real or os.path.islink(folder.parent):
            return
        shutil.rmtree(folder, ignore_errors=True)  # the fd-based rmtree: never follows links inside

    @staticmethod
    def _tagged(real: Path) -> bool:
        try:
            return (real / _TAG).read_text() == _TAG_TEXT
        except (OSError, UnicodeDecodeError):
            return False

    def _authentic(self, stage: str, key: str, record: str) -> bool:
        """Whether ``record`` is an entry record this user's cache wrote (its MAC verifies with the cache key)."""
        try:
            secret = self._secret or cache_secret()
            data = read_json(record)
        except (OSError, ValueError):
            return False
        mac = data.get("mac") if isinstance(data, dict) else None
        return isinstance(mac, str) and hmac.compare_digest(mac, _mac(secret, stage, key, data))

    def _entry_folders(self, real: Path) -> list[Path]:
        """Entry folders as the cache writes them: real folders holding a real ``stage.json`` that this user's
        cache key authenticates, two levels down. A folder of someone's files that happens to hold a
        ``stage.json`` (a CI job's, ``--dir`` pointed at the wrong folder) is never an entry, so never deleted."""
        found: list[Path] = []
        if not real.is_dir():
            return found
        for stage in os.scandir(real):
            if not _real_dir(stage.path):
                continue
            for entry in os.scandir(stage.path):
                if not _real_dir(entry.path):
                    continue
                record = os.path.join(entry.path, _RECORD)
                try:
                    if stat.S_ISREG(os.lstat(record).st_mode) and self._authentic(stage.name, entry.name, record):
                        found.append(Path(entry.path))
                except OSError:
                    continue
        return found

    def entries(self) -> list[tuple[Path, int, float]]:
        """Every entry as (folder, bytes, last use), least recently used first.

        Raises:
            InputError: the cache folder is a link or not this user's.
        """
        rows = []
        for folder in self._entry_folders(self._real_root()):
            try:
                size = 0
                for base, _dirs, names in os.walk(folder):  # os.walk never descends into links
                    for n in names:
                        st = os.lstat(os.path.join(base, n))
                        size += st.st_size if stat.S_ISREG(st.st_mode) else 0
                rows.append((folder, size, os.lstat(folder / _RECORD).st_mtime))
            except OSError:
                continue
        return sorted(rows, key=lambda r: r[2])

    def prune(self, max_bytes: int) -> tuple[int, int]:
        """Delete least recently used entries until the cache holds at most ``max_bytes``.

        Returns (entries removed, bytes freed). Half-written temp folders of this cache are removed too.

        Raises:
            InputError: the cache folder is a link or not this user's (nothing is deleted).
        """
        real = self._real_root()
        if real.is_dir() and self._tagged(real):  # stray temp folders only where the cache made the folder
            for stage in os.scandir(real):
                if not _real_dir(stage.path):
                    continue
                for tmp in os.scandir(stage.path):
                    if not _TEMP.match(tmp.name) or not _real_dir(tmp.path):
                        continue
                    if time.time() - os.lstat(tmp.path).st_mtime > 3600:  # a store killed midway
                        shutil.rmtree(tmp.path, ignore_errors=True)
        rows = self.entries()
        total = sum(r[1] for r in rows)
        removed = freed = 0
        for folder, size, _ in rows:
            if total <= max_bytes:
                break
            self._drop(folder)
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
