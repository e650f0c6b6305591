"""Which files and folders the user's code read while it ran, so they key the stage cache like its source files.

A model factory that loads its weights itself (``net.load_state_dict(torch.load("weights.pt"))``), reads a
``model.yaml``, picks the newest file of a folder, or a calibration callable that reads its samples from disk,
makes its result from files no config key names. Their content must key every stage built from that result,
or a retrained ``weights.pt`` would ship the old weights from the cache.

While user code runs (:func:`edgedeploy.modelio.usercode.running_user_code`), a Python audit hook records the
paths it opens for reading (``open``, ``io.open``, ``os.open``: so ``torch.load``, ``numpy.load``, ``json``,
``yaml``...; not Python source, which is keyed as the model's code) and the folders it lists (``os.listdir``,
``os.scandir``: so ``glob`` and ``Path.iterdir``),
including ones that do not exist (an optional file's absence is what the code saw). Files of the Python
environment (the interpreter, installed packages: keyed by :mod:`edgedeploy.fileio.environment`) and of the
kernel (``/proc``, ``/sys``, ``/dev``) are not recorded. Files read by native code (a Rust or C++ reader that
opens files itself) raise no audit event and are not seen.

Only the paths are recorded, never run or trusted: each is hashed (:func:`path_state`) when the cache key is
computed.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from edgedeploy.fileio.hashing import sha256_file

_EVENTS = frozenset({"open", "os.listdir", "os.scandir"})
_KERNEL = ("/proc/", "/sys/", "/dev/")
_SOURCE = (".py", ".pyc", ".pyi")
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # edgedeploy's package folder
MAX_READS = 2000  # paths kept per build and group; a build whose user code read more is not cached


class ReadLog:
    """The paths user code read in one build, per input group (``model_code``, ``calib_code``)."""

    def __init__(self) -> None:
        self.paths: dict[str, dict[str, None]] = {}  # group -> paths in the order first read
        self.ran: set[str] = set()  # the groups whose code ran in this build (what they read is all in paths)
        self.written: set[str] = set()  # paths user code opened for writing: its own products (a temporary file)

    def add(self, group: str, path: str) -> None:
        self.paths.setdefault(group, {})[path] = None

    def of(self, group: str) -> list[Path]:
        """What ``group``'s code read, in order, less what user code wrote itself in this build."""
        return [Path(p) for p in self.paths.get(group, {}) if p not in self.written]


# the build's log and the group being recorded, while user code runs (one build at a time in a process)
_current: ReadLog | None = None
_recording: list[str] = []
_skipped: tuple[str, ...] = ()
_hooked = False


def _environment_folders() -> tuple[str, ...]:
    """Folders whose files the environment key already holds: the interpreter's, the installed packages', and
    edgedeploy's own."""
    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.dirname(__file__))}
    folders.update(v for k, v in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib"))
    folders.update(p for p in sys.path if p.rstrip(os.sep).endswith(("site-packages", "dist-packages")))
    return tuple(sorted(os.path.abspath(f).rstrip(os.sep) + os.sep for f in folders if f))


def _hook(event: str, args: tuple) -> None:
    if not _recording or event not in _EVENTS or _current is None:
        return
    raw = args[0] if args else None
    if isinstance(raw, int) or raw is None:  # a file descriptor: whatever opened it was recorded then
        return
    try:
        path = os.path.abspath(os.fsdecode(os.fspath(raw)))
    except (TypeError, ValueError):
        return
    # Python source is keyed as the model's code (its imports); reading it otherwise is for display: a traceback
    # or torch's lazy-init stack record reading the caller's lines through linecache
    if path.endswith(_SOURCE) or path.startswith(_KERNEL) or path.startswith(_skipped) or not _asked_by_user_code():
        return
    if event == "open":
        mode, flags = args[1], args[2]
        access = flags & os.O_ACCMODE if isinstance(flags, int) else os.O_RDONLY
        if (isinstance(mode, str) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (
            mode is None and access != os.O_RDONLY
        ):
            _current.written.add(path)
        if (isinstance(mode, str) and "r" not in mode and "+" not in mode) or (mode is None and access == os.O_WRONLY):
            return
    _current.add(_recording[-1], path)


def _asked_by_user_code() -> bool:
    """Whether the innermost frame outside the environment's code (installed packages, the stdlib) is the user's:
    ``torch.load`` called by the factory is; the import system listing a folder, a package probing paths while
    it is imported, or edgedeploy reading the user's source (to list its imports) is not (what a module reads
    as it runs is)."""
    frame: FrameType | None = sys._getframe(2)  # the code that raised the audit event (above this and the hook)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith("<frozen importlib") or name.startswith(_OWN):  # an import, or edgedeploy's own read
            return False
        if not name.startswith("<") and not name.startswith(_skipped):
            return True
        frame = frame.f_back
    return False


@contextmanager
def building(log: ReadLog) -> Iterator[ReadLog]:
    """Within the block, user code run under :func:`recording` adds what it reads to ``log``."""
    global _current, _skipped, _hooked
    if not _hooked:  # an audit hook cannot be removed: one for the process, idle outside a build's user code
        sys.addaudithook(_hook)
        _hooked = True
    previous, _current, _skipped = _current, log, _environment_folders()
    try:
        yield log
    finally:
        _current = previous


@contextmanager
def recording(group: str) -> Iterator[None]:
    """Within the block (user code running), what it reads is recorded for input group ``group`` of the build."""
    _recording.append(group)
    if _current is not None:
        _current.ran.add(group)
    try:
        yield
    finally:
        _recording.pop()


def path_state(path: Path) -> str:
    """What a read path held: ``file:<sha256>``, ``folder:<sha256 of its sorted names>``, or ``absent``."""
    try:
        if path.is_dir():
            names = sorted(os.listdir(path))
            return "folder:" + hashlib.sha256("\0".join(names).encode()).hexdigest()
        if path.is_file():
            return "file:" + sha256_file(path)
    except OSError:
        return "unreadable"
    return "absent"
