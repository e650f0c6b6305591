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
opens files itself) raise no audit event: the common readers of that kind (:data:`NATIVE_READERS`:
safetensors, torchvision's image reader, TorchScript, OpenCV, soundfile, h5py) are wrapped to record their
path argument as an ``open`` would; other native readers are not seen.

Only the paths are recorded, never run or trusted: each is hashed (:func:`path_state`) when the cache key is
computed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import os
import sys
import sysconfig
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextlib import suppress as _suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from edgedeploy.fileio.hashing import sha256_file

_EVENTS = frozenset({"open", "os.listdir", "os.scandir"})
_KERNEL = ("/proc/", "/sys/", "/dev/")
_SOURCE = (".py", ".pyc", ".pyi")
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # edgedeploy's package folder
MAX_READS = 20000  # paths kept per build and group; a build whose user code read more is not cached


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
    """Folders whose files the environment key already holds: the standard library's, the installed packages',
    and edgedeploy's own. Not the interpreter's whole prefix: a project in ``/usr/src/app`` under a system
    Python whose prefix is ``/usr`` is the user's."""
    folders = {os.path.dirname(os.path.dirname(__file__))}
    folders.update(v for k, v in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib"))
    folders.update(p for p in sys.path if p.rstrip(os.sep).endswith(("site-packages", "dist-packages")))
    return tuple(sorted(os.path.abspath(f).rstrip(os.sep) + os.sep for f in folders if f))


def _hook(event: str, args: tuple) -> None:
    if event not in _EVENTS:
        return
    log = _current  # both read once: another thread may end the recording meanwhile
    try:
        group = _recording[-1]
    except IndexError:
        return
    if log is None:
        return
    try:
        _note(log, group, event, args)
    except Exception:  # an audit hook that raised would fail the open() of whoever asked
        return


def _note(log: ReadLog, group: str, event: str, args: tuple, *, asked: bool = False) -> None:
    """Record one event's path for ``group`` (``asked``: known to be the user code's, no frame walk)."""
    raw = args[0] if args else None
    if isinstance(raw, int) or raw is None:  # a file descriptor: whatever opened it was recorded then
        return
    try:
        path = os.path.abspath(os.fsdecode(os.fspath(raw)))
    except (TypeError, ValueError):
        return
    # Python source is keyed as the model's code (its imports); reading it otherwise is for display: a traceback
    # or torch's lazy-init stack record reading the caller's lines through linecache
    if path.endswith(_SOURCE) or path.startswith(_KERNEL) or path.startswith(_skipped):
        return
    if not asked and not _asked_by_user_code():
        return
    if event == "open":
        mode, flags = args[1], args[2]
        flags = flags if isinstance(flags, int) else 0
        if isinstance(mode, str):
            writes, reads_it = any(c in mode for c in "wxa"), "r" in mode or "+" in mode
        else:  # os.open: flags only
            access = flags & os.O_ACCMODE
            writes = access == os.O_WRONLY or bool(flags & (os.O_CREAT | os.O_TRUNC))
            reads_it = access != os.O_WRONLY
        if writes:  # made (or remade) by the code itself: its own product, not an input (a temporary file)
            log.written.add(path)
        if not reads_it:
            return
    log.add(group, path)


def _asked_by_user_code() -> bool:
    """Whether the innermost frame outside the environment's code (installed packages, the stdlib) is the user's:
    ``torch.load`` called by the factory is; the import system listing a folder, a package probing paths while
    it is imported, or edgedeploy reading the user's source (to list its imports) is not (what a module reads
    as it runs is)."""
    frame: FrameType | None = sys._getframe(3)  # the code that raised the event (above this, _note and the hook)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith("<frozen importlib") or name.startswith(_OWN):  # an import, or edgedeploy's own read
            return False
        if not name.startswith("<") and not name.startswith(_skipped):
            return True
        frame = frame.f_back
    # no user frame: in the main thread the read was the environment's own; in another thread (a loader pool the
    # factory started: torch.load run by a ThreadPoolExecutor) it was made for the code being recorded
    return threading.current_thread() is not threading.main_thread()


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
def recording(group: str, *, runs: bool = False) -> Iterator[None]:
    """Within the block (user code running), what it reads is recorded for input group ``group`` of the build.

    ``runs``: the block runs the code itself (the factory, the calibration callable), not only imports its module:
    what it read is then all the code reads, and replaces what was remembered of it
    (:attr:`ReadLog.ran`). A file opened by one of the :data:`NATIVE_READERS` (native code, which raises no audit
    event) is recorded too, whether its module was loaded before the block or is imported inside it.
    """
    _recording.append(group)
    if runs and _current is not None:
        _current.ran.add(group)
    outermost = len(_recording) == 1
    if outermost:
        _watch_native_readers(sys.modules)
        sys.meta_path.insert(0, _WATCH_ON_IMPORT)
    try:
        yield
    finally:
        if outermost:
            with _suppress(ValueError):
                sys.meta_path.remove(_WATCH_ON_IMPORT)
        _recording.pop()


@dataclass(frozen=True)
class NativeReader:
    """A function (or a class's ``__init__``) that opens a file in native code, and where its path argument is."""

    module: str
    attribute: str  # "safe_open", or "File.__init__"
    path_at: int = 0  # the path's position among the positional arguments (``self`` counts)
    mode_at: int | None = None  # the open mode's position (or its ``mode`` keyword), where the reader can also write


# readers whose files reach the model or its calibration samples without a Python open(); each is wrapped once,
# for the rest of the process, and records only while user code is being recorded (transparent otherwise)
NATIVE_READERS: tuple[NativeReader, ...] = (
    NativeReader("safetensors.torch", "safe_open"),  # safetensors.torch.load_file (Rust)
    NativeReader("safetensors", "safe_open"),
    NativeReader("torchvision.io", "read_file"),  # torchvision's C++ file reader
    NativeReader("torchvision.io.image", "read_file"),  # read_image, decode_image(path)
    NativeReader("torch.jit", "load"),  # TorchScript (C++)
    NativeReader("torch", "from_file"),
    NativeReader("cv2", "imread"),  # OpenCV (C++)
    NativeReader("cv2", "imreadmulti"),
    NativeReader("soundfile", "SoundFile.__init__", path_at=1, mode_at=2),  # libsndfile: soundfile.read too
    NativeReader("h5py", "File.__init__", path_at=1, mode_at=2),  # HDF5
)
_WRAPPED = "__edgedeploy_records_reads__"


def _watch_native_readers(modules: dict[str, Any], only: str | None = None) -> None:
    """Wrap each :data:`NATIVE_READERS` entry whose module is loaded (``only``: that module's entries)."""
    for reader in NATIVE_READERS:
        if only is not None and reader.module != only:
            continue
        module = modules.get(reader.module)
        if module is None:
            continue
        *owner_path, name = reader.attribute.split(".")
        owner: Any = module
        for part in owner_path:
            owner = getattr(owner, part, None)
        original = getattr(owner, name, None) if owner is not None else None
        if original is None or getattr(original, _WRAPPED, False):
            continue
        try:
            setattr(owner, name, _recording_reader(original, reader))
        except (AttributeError, TypeError):  # a read-only attribute (an extension type's): left as it is
            continue


def _recording_reader(original: Any, reader: NativeReader) -> Any:
    @functools.wraps(original)
    def reads(*args: Any, **kwargs: Any) -> Any:
        log = _current
        if log is not None and _recording:
            with _suppress(Exception):  # recording never fails the read
                path, mode = _argument(args, kwargs, reader), _mode(args, kwargs, reader)
                _note(log, _recording[-1], "open", (path, mode, 0), asked=True)
        return original(*args, **kwargs)

    setattr(reads, _WRAPPED, True)
    return reads


def _argument(args: Sequence[Any], kwargs: dict[str, Any], reader: NativeReader) -> Any:
    if len(args) > reader.path_at:
        return args[reader.path_at]
    # the path passed by keyword: the first keyword that is a path (filename, file, name, f, path)
    return next((v for k, v in kwargs.items() if k in ("filename", "file", "name", "f", "path")), None)


def _mode(args: Sequence[Any], kwargs: dict[str, Any], reader: NativeReader) -> str:
    if reader.mode_at is None:
        return "r"
    mode = args[reader.mode_at] if len(args) > reader.mode_at else kwargs.get("mode")
    return mode if isinstance(mode, str) else "r"  # h5py's and soundfile's default mode reads


class _WatchOnImport(importlib.abc.MetaPathFinder):
    """While user code is recorded, a module of :data:`NATIVE_READERS` imported then (a reader imported inside the
    calibration function) has its readers wrapped as soon as it has run."""

    modules = frozenset(r.module for r in NATIVE_READERS)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if getattr(spec.loader, "exec_module", None) is not None:
                spec.loader = _WatchingLoader(spec.loader, fullname)
            return spec
        return None


class _WatchingLoader(importlib.abc.Loader):
    """Runs the module with its own loader, then wraps its readers."""

    def __init__(self, loader: Any, name: str) -> None:
        self.loader, self.name = loader, name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        _watch_native_readers({self.name: module}, only=self.name)

    def __getattr__(self, name: str) -> Any:  # get_data, is_package, ...: the module's own loader answers
        return getattr(self.loader, name)


_WATCH_ON_IMPORT = _WatchOnImport()


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
