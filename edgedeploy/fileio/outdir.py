"""The output folder as a unit: built beside it, switched in with one atomic rename, one build at a time.

A build writes into a sibling staging folder ``.<out>.staging-<id>`` (same filesystem), then the
finished folder replaces ``<out>`` in one step: ``renameat2(RENAME_EXCHANGE)`` where Linux offers it
(a reader sees the old folder or the new one, never a mix and never nothing); elsewhere two renames
(``<out>`` -> ``.<out>.old-<id>``, staging -> ``<out>``), and a build killed between them is rolled
back to the old folder by the next one. A lock file ``.<out>.lock`` (filelock) serialises builds into
one folder. Nothing named in a manifest is ever deleted: the previous folder is retired as a whole,
and only when it holds nothing edgedeploy did not write.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import stat
import sys
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

from edgedeploy.errors import ArtifactIntegrityError, ConfigError, InputError
from edgedeploy.jsonread import read_json

MARKER = ".edgedeploy-out"
MARKER_SCHEMA = "edgedeploy-out/1"
CACHE_DIR = ".cache"
FAILED_DIR = ".last-failed"
SIGNATURE = "release.sig"  # written by 'deploy sign' (edgedeploy.fileio.signing); part of the release
# what the device step (complete_bundle.py) writes beside a bundle.json; a rebuild replaces them with the bundle
DEVICE_OUTPUTS = ("model.engine", "engine.json", "validation.json", "timing.cache")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100

# Called with the name of each publish step just before it runs; tests inject failures and kill -9 here.
step_hook: Callable[[str], None] = lambda step: None  # noqa: E731


def confined(root: Path, name: Any, what: str = "artifact") -> Path:
    """``root / name`` for a name read from a manifest, refused unless it stays inside ``root``.

    Raises:
        ArtifactIntegrityError: not a plain relative name (absolute, ``..``, backslash, NUL),
            or it resolves outside ``root`` through a link.
    """
    text = name if isinstance(name, str) else ""
    parts = text.split("/")
    if not text or "\x00" in text or "\\" in text or text.startswith("/") or ".." in parts or "" in parts:
        raise ArtifactIntegrityError(
            f"{what} name {name!r} is not a plain relative name inside {root}; refusing it",
            hint="the manifest was edited or forged: rebuild with 'deploy build'",
        )
    path = root / text
    real_root = root.resolve()
    if not path.resolve().is_relative_to(real_root):
        raise ArtifactIntegrityError(f"{what} {text!r} resolves outside {root} (a link); refusing it")
    return path


def clone_or_copy(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst``: a reflink where the filesystem can (btrfs, xfs), else a plain copy.

    Never a hard link: a hard link shares one file between the cache and every release restored
    from it, so editing one release's model.onnx in place would change another's.
    """
    with open(src, "rb") as fs:
        clone_or_copy_open(fs, dst)


def clone_or_copy_open(src: BinaryIO, dst: Path) -> None:
    """:func:`clone_or_copy` from a file already open: the bytes of that very inode, whatever its path names by
    the time they are read; ``dst`` gets its permission bits."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    st = os.fstat(src.fileno())
    with open(dst, "wb") as out:
        try:
            import fcntl

            fcntl.ioctl(out.fileno(), 0x40049409, src.fileno())  # FICLONE
        except (OSError, ImportError, AttributeError):
            _copy_bytes(src, out, st.st_size)
    os.chmod(dst, stat.S_IMODE(st.st_mode))


def _copy_bytes(src: BinaryIO, out: BinaryIO, size: int) -> None:
    """All of ``src`` into ``out``: in the kernel where it can (sendfile), else through a buffer."""
    offset = 0
    try:
        while offset < size:
            sent = os.sendfile(out.fileno(), src.fileno(), offset, size - offset)
            if sent == 0:
                break
            offset += sent
        if offset >= size:
            return
    except (OSError, AttributeError):  # no file-to-file sendfile here (macOS): copy through Python
        pass
    src.seek(offset)
    out.seek(offset)
    shutil.copyfileobj(src, out, 1 << 20)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False when not supported here."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _rmtree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


class OutputFolder:
    """One build's hold on ``out``: the lock, recovery, the ownership check, staging and publishing.

    Use as a context manager around the whole build.
    """

    def __init__(
        self,
        out: Path,
        *,
        inputs: Iterable[Path] = (),
        log: Callable[[str], None] | None = None,
        sha256: Callable[[Path], str] | None = None,
    ) -> None:
        """``sha256``: hashes a file of the previous output against its manifest (a digest memo's, so an
        unchanged file is not read again); default: read every one."""
        self.out = Path(os.path.abspath(out))
        self.inputs = [Path(os.path.abspath(p)) for p in inputs]
        self.log = log
        self._sha256 = sha256
        self._lock: Any = None

    # ---- names beside <out> -----------------------------------------------------------------------
    def _sibling(self, kind: str) -> Path:
        return self.out.parent / f".{self.out.name}.{kind}-{uuid.uuid4().hex[:8]}"

    def _siblings(self, kind: str) -> list[Path]:
        return sorted(self.out.parent.glob(f".{self.out.name}.{kind}-*"))

    @property
    def lock_path(self) -> Path:
        return self.out.parent / f".{self.out.name}.lock"

    # ---- entering ---------------------------------------------------------------------------------
    def __enter__(self) -> OutputFolder:
        self._check_path()
        from filelock import FileLock, Timeout

        self._lock = FileLock(str(self.lock_path))
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            # made here first: filelock takes any failure to create its file for a lock held elsewhere and waits
            # forever (a folder that takes no new files, e.g. under /proc)
            # O_NOFOLLOW: a planted link named like the lock must not make a file where it points
            os.close(os.open(self.lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644))
            try:
                self._lock.acquire(timeout=0)
            except Timeout:
                if self.log:
                    self.log(f"waiting for another build into {self.out} to finish (lock {self.lock_path})")
                self._lock.acquire()
        except OSError as exc:
            raise ConfigError(
                f"build.out: cannot write beside {self.out} ({exc.strerror or exc}: {exc.filename or self.lock_path}); "
                "a build is staged next to its output folder and switched in by rename",
                hint="point --out at a folder inside a writable folder",
            ) from None
        try:
            self.recover()
            self.check_owned()
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.release()

    def _check_path(self) -> None:
        out = self.out
        if out.exists() and not out.is_dir():
            raise ConfigError(
                f"build.out: {out} is a file, not a folder", hint="pass --out pointing at a (new or empty) folder"
            )
        above = next((p for p in out.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            raise ConfigError(
                f"build.out: {above} is a file, so {out} cannot be made below it",
                hint="pass --out pointing at a (new or empty) folder whose parents are folders",
            )
        for p in self.inputs:
            if p == out or out in p.parents:
                raise ConfigError(
                    f"build.out: {out} contains this build's input {p}; a build replaces its output folder as a whole",
                    hint="pass --out pointing at a separate folder, e.g. --out out",
                )
        if out.is_dir() and os.path.ismount(out):
            raise ConfigError(
                f"build.out: {out} is a mount point; the finished build is switched in by renaming the folder",
                hint=f"point --out at a folder below it, e.g. --out {out / 'build'}",
            )

    def recover(self) -> None:
        """Undo what a killed build left: restore a retired folder if ``out`` is gone, drop staging folders.

        Called with the lock held, so no other build is using these folders.
        """
        # only real folders are a killed build's leftovers: a link named like one (planted) is removed, never
        # followed, so nothing outside becomes OUT or moves into it
        old = self._siblings("old")
        planted = [p for p in [*old, *self._siblings("staging")] if p.is_symlink() or not p.is_dir()]
        for path in planted:
            path.unlink(missing_ok=True)
        old = [p for p in old if p not in planted]
        if old and not os.path.lexists(self.out):
            newest = max(old, key=lambda p: p.lstat().st_mtime)
            os.rename(newest, self.out)
            if self.log:
                self.log(f"restored {self.out} from {newest.name} (an earlier build was killed while publishing)")
            old.remove(newest)
        for staging in [p for p in self._siblings("staging") if p not in planted]:
            cache = staging / CACHE_DIR
            if (
                cache.is_dir()
                and not cache.is_symlink()
                and self.out.is_dir()
                and not self.out.is_symlink()
                and not os.path.lexists(self.out / CACHE_DIR)
            ):
                os.rename(cache, self.out / CACHE_DIR)  # killed after moving the cache over, before the switch
            _rmtree(staging)
        for path in old:
            _rmtree(path)
        if self.out.is_dir():
            for legacy in self.out.glob(".staging-*"):  # left inside <out> by earlier versions
                _rmtree(legacy)

    def check_owned(self) -> None:
        """Refuse an ``out`` that edgedeploy did not write, or that holds files it did not write.

        Raises:
            InputError: a non-empty folder that is not an edgedeploy output, or files in it that no
                manifest lists (all named, up to five), which a build would otherwise delete.
        """
        if not self.out.is_dir():
            return
        entries = {p.name for p in self.out.iterdir()}
        if not entries:
            return
        manifest = _read_json(self.out / "manifest.json")
        ours = (self.out / MARKER).is_file() or str(manifest.get("schema", "")).startswith("edgedeploy-manifest/")
        if not ours and not entries <= {CACHE_DIR, FAILED_DIR}:
            raise InputError(
                f"build.out: {self.out} is not empty and is not an edgedeploy output folder "
                f"(it holds {', '.join(sorted(entries)[:5])}); a build replaces its output folder as a whole",
                hint="pass --out pointing at a new or empty folder",
            )
        artifacts = manifest.get("artifacts")
        recorded: dict[str, Any] = artifacts if isinstance(artifacts, dict) else {}
        self._check_recorded(recorded)
        listed = {n for n in recorded if isinstance(n, str)} | {"manifest.json", MARKER, SIGNATURE}
        foreign = []
        for path in sorted(self.out.rglob("*")):
            rel = path.relative_to(self.out).as_posix()
            top = rel.split("/", 1)[0]
            if path.is_dir() and not path.is_symlink():
                continue
            if top in (CACHE_DIR, FAILED_DIR) or rel in listed:
                continue
            if path.name in DEVICE_OUTPUTS and (path.parent / "bundle.json").is_file():
                continue
            foreign.append(rel)
        if foreign:
            raise InputError(
                f"build.out: {self.out} holds files deploy build did not write ({', '.join(foreign[:5])}"
                f"{', ...' if len(foreign) > 5 else ''}); a build replaces its output folder as a whole",
                hint="move them out of the folder, or pass --out pointing at another folder",
            )

    def _check_recorded(self, recorded: dict[str, Any]) -> None:
        """Every file the folder's manifest lists is the file it recorded (its sha256): a manifest decides which
        files a build may delete, so one that does not vouch for what is there (planted beside someone's files,
        or the files changed since) decides nothing.

        Raises:
            InputError: a listed file differs from its recorded sha256, or is a link.
        """
        from edgedeploy.fileio.hashing import sha256_file

        digest = self._sha256 or sha256_file
        for name, want in recorded.items():
            path = self.out / str(name)
            if not os.path.lexists(path) or not isinstance(name, str) or Path(name).is_absolute() or ".." in name:
                continue  # absent, or a name no file of this folder answers to: it lists nothing here
            if path.is_symlink() or not path.is_file() or digest(path) != want:
                raise InputError(
                    f"build.out: {path} is not the file {self.out / 'manifest.json'} records (changed since it was "
                    "built, or the manifest is not this tool's); a build replaces its output folder as a whole",
                    hint="move the folder away, or pass --out pointing at a new folder",
                )

    # ---- building and publishing ------------------------------------------------------------------
    def new_staging(self) -> Path:
        """A fresh staging folder beside ``out`` (same filesystem, so the switch is a rename)."""
        staging = self._sibling("staging")
        staging.mkdir(parents=True)
        return staging

    def publish(self, staging: Path) -> None:
        """Make the finished ``staging`` folder the new ``out`` in one step; retire the old folder.

        The cache folder inside ``out`` is carried over; ``.last-failed`` is dropped (this build passed).
        """
        step_hook("marker")
        (staging / MARKER).write_text(json.dumps({"schema": MARKER_SCHEMA}) + "\n")
        if not self.out.exists():
            step_hook("install")
            os.rename(staging, self.out)
            return
        moved_cache = False
        try:
            step_hook("cache")
            if (self.out / CACHE_DIR).is_dir() and not (staging / CACHE_DIR).exists():
                os.rename(self.out / CACHE_DIR, staging / CACHE_DIR)
                moved_cache = True
            step_hook("switch")
            exchanged = _exchange(staging, self.out)
        except BaseException:
            if moved_cache:  # put the cache back: the build did not publish
                os.rename(staging / CACHE_DIR, self.out / CACHE_DIR)
            raise
        if exchanged:
            step_hook("cleanup")
            _rmtree(staging)  # now holds the previous folder
            return
        retired = self._sibling("old")
        step_hook("retire")
        os.rename(self.out, retired)
        try:
            step_hook("install")
            os.rename(staging, self.out)
        except BaseException:
            os.rename(retired, self.out)
            if moved_cache:
                os.rename(staging / CACHE_DIR, self.out / CACHE_DIR)
            raise
        step_hook("cleanup")
        _rmtree(retired)

    def fail(self, staging: Path) -> Path:
        """Keep a failed build's staging folder as ``out/.last-failed``; touch nothing else in ``out``."""
        failed = self.out / FAILED_DIR
        self.out.mkdir(parents=True, exist_ok=True)
        _rmtree(failed)
        try:
            os.rename(staging, failed)
        except OSError:
            _rmtree(staging)
        return failed

    def discard(self, staging: Path) -> None:
        with contextlib.suppress(OSError):
            _rmtree(staging)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# a build writes several copies of the model (TorchScript, ONNX, fp16/int8, bundle) plus goldens and reports
MIN_FREE_BYTES = 64 << 20
MODEL_COPIES = 8


def check_free_space(folder: Path, checkpoint: Path | None, *, free: int | None = None) -> None:
    """Refuse to start a build that cannot fit on the disk of ``folder``.

    Some writers cannot fail cleanly when the disk fills up (TorchScript's C++ writer aborts the
    process), so the estimate is checked before anything is written.

    Raises:
        InputError: less free space than the estimate (both named).
    """
    need = MIN_FREE_BYTES + MODEL_COPIES * (checkpoint.stat().st_size if checkpoint and checkpoint.is_file() else 0)
    probe = folder if folder.exists() else folder.parent
    if free is None:
        try:
            free = shutil.disk_usage(probe).free
        except OSError:
            return
    if free < need:
        raise InputError(
            f"not enough disk space for a build in {folder}: {free / 2**20:.0f} MiB free, about "
            f"{need / 2**20:.0f} MiB needed ({MODEL_COPIES} copies of the checkpoint + reports)",
            hint="free space (deploy cache prune --max-size 1G) or pass --out on a bigger disk",
        )


def disk_full(exc: OSError, where: Path) -> InputError | None:
    """The one-line error for a disk that filled up during a build (None for other OS errors)."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    return InputError(
        f"disk full while building into {where}: {exc.strerror} ({exc.filename or 'writing an artifact'}); "
        "nothing was published, the previous output is unchanged",
        hint="free space (deploy cache prune --max-size 1G) or pass --out on a bigger disk",
    )
