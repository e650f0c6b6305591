#!/usr/bin/env python3
"""Complete an edgedeploy device bundle where TensorRT runs: verify, build the engine, validate it.

Copied into every TensorRT bundle as ``complete_bundle.py``; run it on the device::

    python3 -I complete_bundle.py .                         # verify, build model.engine, validate
    python3 -I complete_bundle.py . --engine model.engine   # validate an engine built earlier
    python3 -I complete_bundle.py . --runner onnxruntime    # dry run on any machine (no TensorRT)

It needs no torch and no edgedeploy: only TensorRT's Python bindings (JetPack ships them),
numpy and polygraphy, plus its siblings ``trt_adapter.py`` and ``parity.py``. It keeps to
Python 3.6 syntax (JetPack 4.6; JetPack 5 has 3.8, JetPack 6 has 3.10), checked by vermin in CI.

Steps: every file's sha256 is checked against ``bundle.json`` (any difference stops the run,
exit 9); the engine is built with ``plan.json`` through the adapter (an out-of-memory build is
retried with half the workspace, and said so); ``engine.json`` records the TensorRT version,
GPU, precision, profiles and hashes; before any engine is deserialized its sha256 and its
TensorRT / GPU are checked against the running ones (exit 10 on a mismatch); then the engine's
outputs on the golden inputs are compared with PyTorch's golden outputs (exit 7 on failure).
Exit codes are edgedeploy's. ``--runner onnxruntime`` runs the same comparison with an ONNX
Runtime session on the plan's ONNX model in place of the engine; it builds no engine.
"""
# Python 3.6 syntax on purpose (no `from __future__ import annotations`, typing generics):
# ruff: noqa: UP006, UP035, UP045, E402

import sys


def _system_path(path, pythonpath, cwd, here):
    # type: (List[str], str, str, str) -> List[str]
    """The entries of ``path`` that are the interpreter's own (stdlib, its site and user site folders).

    A bundle folder is data, never code to import: Python puts a script's own folder first on sys.path
    (unless run with -I or -P), PYTHONPATH=. adds the current folder, so an argparse.py or json.py
    dropped beside this file would run on the first import below, before any hash is checked. Kept:
    absolute entries under the interpreter's prefixes or named by ``site``; dropped: relative entries,
    the current folder, this file's folder and every PYTHONPATH entry. Plain string work only:
    nothing here may import a module before the path is clean.
    """
    site = sys.modules.get("site")  # imported at start-up (or not at all with -S): no import here
    roots = [p for p in (sys.prefix, sys.exec_prefix, getattr(sys, "base_prefix", ""),
                         getattr(sys, "base_exec_prefix", "")) if p]  # fmt: skip
    named = []  # type: List[str]
    for getter in ("getsitepackages", "getusersitepackages"):
        try:
            found = getattr(site, getter)()
        except Exception:  # an old virtualenv's site.py lacks them; -S leaves no site at all
            continue
        named.extend([found] if isinstance(found, str) else found)
    refused = set(p.rstrip("/") for p in pythonpath.split(":") if p) | {cwd.rstrip("/"), here.rstrip("/")}
    kept = []
    for entry in path:
        norm = entry.rstrip("/")
        if not entry.startswith("/") or norm in refused or norm.startswith(here.rstrip("/") + "/"):
            continue
        if norm in named or any(norm == r.rstrip("/") or norm.startswith(r.rstrip("/") + "/") for r in roots):
            kept.append(entry)
    return kept


if __name__ == "__main__" and "posix" in sys.builtin_module_names:
    import posix  # built into the interpreter (never read from sys.path): getcwd and the environment

    _env = posix.environ.get(b"PYTHONPATH", b"")  # type: Any
    sys.path[:] = _system_path(
        sys.path,
        _env.decode("utf-8", "replace") if isinstance(_env, bytes) else str(_env),
        posix.getcwd(),
        __file__.rpartition("/")[0] if __file__.startswith("/") else posix.getcwd() + "/" + __file__.rpartition("/")[0],
    )
elif __name__ == "__main__" and not (sys.flags.isolated or getattr(sys.flags, "safe_path", False)) and sys.path:
    del sys.path[0]  # elsewhere (Windows): at least the script's own folder goes

import argparse
import errno
import hashlib
import importlib
import json
import os
import shutil
import stat
import tempfile
import time
import types
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

BUNDLE_MANIFEST = "bundle.json"
BUNDLE_SCHEMA = "edgedeploy-bundle/1"
PLAN = "plan.json"
ENGINE_RECORD = "engine.json"
ENGINE_SCHEMA = "edgedeploy-engine/1"
VALIDATION = "validation.json"
SIBLINGS = {
    "trt_adapter": "edgedeploy.trt.adapter",
    "parity": "edgedeploy.validate.parity",
    "trt_runner": "edgedeploy.device.trt_runner",
    "goldens_format": "edgedeploy.device.goldens_format",
}

if __name__ == "__main__":  # also any other entry naming this folder (PYTHONPATH=.), now that os is safe to import
    _HERE = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != _HERE]

# the bundle verify_bundle last checked: {"folder": abs path, "files": {name: sha256}}; helpers load only from it
_VERIFIED = {}  # type: Dict[str, Any]
_LOADED = {}  # type: Dict[str, Any]

# edgedeploy's exit codes (edgedeploy/errors.py); a test keeps them equal
EXIT_INPUT = 3
EXIT_STAGE = 6
EXIT_PARITY = 7
EXIT_INTEGRITY = 9
EXIT_COMPAT = 10


class BundleError(Exception):
    """A failure the device step reports in one line, with edgedeploy's exit code."""

    exit_code = 1
    kind = "error"

    def __init__(self, message: str, hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = f"{self.kind}: {self.message}"
        if self.hint:
            text += f" -- fix: {self.hint}"
        return " ".join(text.split())


class BundleInputError(BundleError):
    exit_code = EXIT_INPUT
    kind = "input error"


class BuildFailed(BundleError):
    exit_code = EXIT_STAGE
    kind = "stage failed"


class ParityFailed(BundleError):
    exit_code = EXIT_PARITY
    kind = "parity failure"


class IntegrityFailed(BundleError):
    exit_code = EXIT_INTEGRITY
    kind = "artifact integrity error"


class EngineIncompatible(BundleError):
    exit_code = EXIT_COMPAT
    kind = "engine incompatible"


def sibling(name: str) -> Any:
    """A helper module (``trt_adapter``, ``parity``).

    Inside edgedeploy (``deploy bundle complete``) the installed package's module; run standalone
    from a bundle, the bundle's own copy, loaded by explicit path only after ``verify_bundle``
    passed, from bytes hashed again at load time (never through sys.path).

    Raises:
        IntegrityFailed: the bundle was not verified, or the helper changed since it was.
    """
    if name in _LOADED:
        return _LOADED[name]
    if __name__.startswith("edgedeploy."):
        module = importlib.import_module(SIBLINGS[name])
    else:
        module = _load_verified(name + ".py")
    _LOADED[name] = module
    return module


def verified_bytes(filename: str, use: str = "use it") -> bytes:
    """The bytes of a file ``bundle.json`` lists, read once and checked against its sha256 as read, so what is
    used is what was verified, even if the file is replaced after :func:`verify_bundle`.

    Raises:
        IntegrityFailed: the file is not a verified one of this bundle, or differs now.
    """
    folder = _VERIFIED.get("folder")
    sha = (_VERIFIED.get("files") or {}).get(filename)
    if not folder or not sha:
        raise IntegrityFailed(
            f"{filename}: not a verified file of this bundle; refusing to {use}",
            hint="run complete_bundle.py on a bundle whose bundle.json lists it",
        )
    path = os.path.join(folder, filename)
    try:
        data = read_record_bytes(path, max_bytes=1 << 34)
    except OSError as exc:
        raise IntegrityFailed(f"{path} changed after the bundle was verified ({exc}); refusing to {use}") from None
    if hashlib.sha256(data).hexdigest() != sha:
        raise IntegrityFailed(f"{path} changed after the bundle was verified; refusing to {use}")
    return data


def verified_copies(names: List[str], use: str) -> str:
    """A private folder holding copies of the verified files ``names`` (same relative names), each copied once
    from a regular file opened without following a link and hashed as copied. TensorRT's parser and ONNX
    Runtime open a model by name, with its external data beside it: handed these copies, they read what was
    verified even if the bundle's files are replaced meanwhile. The folder is made by ``tempfile.mkdtemp``
    (mode 0700, under ``TMPDIR``): the caller removes it.

    Raises:
        IntegrityFailed: a file is not a verified one of this bundle, or differs now from its sha256.
        BuildFailed: the copy cannot be written (disk full: set TMPDIR to a folder with room).
    """
    folder = _VERIFIED.get("folder")
    files = _VERIFIED.get("files") or {}
    private = tempfile.mkdtemp(prefix="edgedeploy-verified-")
    try:
        for name in names:
            sha = files.get(name)
            if not folder or not sha:
                raise IntegrityFailed(
                    f"{name}: not a verified file of this bundle; refusing to {use}",
                    hint="run complete_bundle.py on a bundle whose bundle.json lists it",
                )
            path = os.path.join(folder, name)
            target = os.path.join(private, *name.split("/"))
            try:
                source = _open_regular(path)
            except OSError as exc:
                raise IntegrityFailed(
                    f"{path} changed after the bundle was verified ({exc}); refusing to {use}"
                ) from None
            try:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                got = _copy_hashed(source, target)
            except OSError as exc:
                raise BuildFailed(
                    f"cannot copy {name} to {private} to {use}: {exc}",
                    hint="set TMPDIR to a folder with room for the model",
                ) from None
            if got != sha:
                raise IntegrityFailed(f"{path} changed after the bundle was verified; refusing to {use}")
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    return private


def _copy_hashed(source: Any, target: str) -> str:
    """Copy the open file ``source`` (closed after) to the new file ``target``; the sha256 of the bytes copied."""
    h = hashlib.sha256()
    with source, open(target, "xb") as copy:
        for chunk in iter(lambda: source.read(1 << 20), b""):
            h.update(chunk)
            copy.write(chunk)
    return h.hexdigest()


def _open_regular(path: str) -> Any:
    """The regular file at ``path`` opened for reading, without following a link or blocking on a FIFO.

    Raises:
        OSError: missing, a link, or not a regular file.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    fh = os.fdopen(os.open(path, flags), "rb")
    if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
        fh.close()
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fh


def model_files(model: str) -> List[str]:
    """``model`` and the verified files that travel with it (its external data, ``model.onnx.data``)."""
    files = _VERIFIED.get("files") or {}
    return [model, *sorted(n for n in files if n.startswith(model + "."))]


def _load_verified(filename: str) -> Any:
    data = verified_bytes(filename, "import it")
    path = os.path.join(_VERIFIED["folder"], filename)
    mod_name = filename[: -len(".py")]
    module = types.ModuleType(mod_name)
    module.__file__ = path
    sys.modules[mod_name] = module  # dataclasses and pickling look a class's module up here
    exec(compile(data, path, "exec"), module.__dict__)
    return module


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


MAX_RECORD_BYTES = 64 << 20  # far above any JSON record a bundle holds


def read_record_bytes(path: str, max_bytes: int = MAX_RECORD_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, opened without following a link or blocking (a FIFO would
    block a plain read for ever; a link to /dev/zero would read until memory ran out), at most ``max_bytes``.

    Raises:
        OSError: missing, a link, not a regular file, or larger than ``max_bytes`` (the message says which).
    """
    with _open_regular(path) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, "larger than a bundle record may be", path)
    return data


def parse_json(data: bytes, path: str, what: str) -> Dict[str, Any]:
    """A JSON object from ``data`` (the bytes of ``path``).

    Raises:
        BundleInputError: not JSON, or not an object.
    """
    try:
        parsed = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        hint = "copy the whole bundle folder again"
        raise BundleInputError(f"{what} unreadable: {path} ({exc})", hint=hint) from None
    if not isinstance(parsed, dict):
        raise BundleInputError(f"{what} is not a JSON object: {path}")
    return parsed


def read_json(path: str, what: str) -> Dict[str, Any]:
    """A JSON object from the regular file at ``path`` (:func:`read_record_bytes`).

    Raises:
        BundleInputError: missing, not a regular file, too large, or not JSON.
    """
    try:
        data = read_record_bytes(path)
    except OSError as exc:
        raise BundleInputError(
            f"{what} unreadable: {path} ({exc})", hint="copy the whole bundle folder again"
        ) from None
    return parse_json(data, path, what)


def write_json(path: str, data: Dict[str, Any]) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, default=str)
        fh.write("\n")
    os.replace(tmp, path)


def write_bytes(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def bundle_path(folder: str, name: Any, what: str = "file") -> str:
    """``folder/name`` for a name read from bundle.json or plan.json, confined to the bundle.

    Raises:
        IntegrityFailed: not a plain relative name (absolute, ``..``, backslash, NUL), or it
            resolves outside the folder (a symlink).
    """
    text = name if isinstance(name, str) else ""
    parts = text.replace("\\", "/").split("/")
    if not text or "\x00" in text or "\\" in text or os.path.isabs(text) or ".." in parts or "" in parts:
        raise IntegrityFailed(
            f"bundle {what} name {name!r} is not a plain relative name inside the bundle; refusing it",
            hint="copy the bundle again from the build host or rebuild it with 'deploy build'",
        )
    root = os.path.realpath(folder)
    path = os.path.join(root, *parts)
    if os.path.realpath(path) != path:
        raise IntegrityFailed(
            f"bundle {what} {text!r} is a link ({os.path.realpath(path)}); refusing it",
            hint="copy the bundle with its files, not links (cp -rL)",
        )
    return path


def _device_outputs(folder: str, manifest: Dict[str, Any]) -> List[str]:
    """Names the device step itself writes into the bundle (engine and timing cache), confined to it."""
    names = [manifest.get("engine") or "model.engine", "timing.cache"]
    plan_name = manifest.get("plan", PLAN)
    if plan_name in (manifest.get("files") or {}):
        try:
            plan = json.loads(read_record_bytes(bundle_path(folder, plan_name, "plan")).decode("utf-8"))
        except (OSError, ValueError):
            plan = {}
        if isinstance(plan, dict):
            names += [plan[k] for k in ("engine", "timing_cache") if plan.get(k)]
    for name in names:
        bundle_path(folder, name, "output")
    return names


def verify_bundle(folder: str, expect_sha256: Optional[str] = None) -> Dict[str, Any]:
    """Check every file ``bundle.json`` lists against its sha256, and that nothing else is there.

    Names are confined to the folder; files the device step writes (the engine, ``engine.json``,
    ``validation.json``, the timing cache) are the only unlisted ones allowed. Returns the manifest.

    Raises:
        IntegrityFailed: the manifest's own hash differs from ``expect_sha256``; a name escapes
            the folder; files are missing, differ, or are not listed (all named in one message).
        BundleInputError: no readable manifest.
    """
    path = os.path.join(folder, BUNDLE_MANIFEST)
    # read once: the bytes hashed against the pin are the bytes parsed (a FIFO could serve other bytes twice)
    try:
        manifest_bytes = read_record_bytes(path)  # type: Optional[bytes]
    except OSError as exc:
        if expect_sha256:  # pinned: only the very file the build wrote will do
            raise IntegrityFailed(
                f"{path}: not the pinned bundle manifest ({exc})", hint="copy the bundle again from the build host"
            ) from None
        manifest_bytes, unreadable = None, exc
    if expect_sha256 and manifest_bytes is not None:
        got = hashlib.sha256(manifest_bytes).hexdigest()
        if got != expect_sha256.lower():
            raise IntegrityFailed(
                f"{path}: sha256 {got[:16]}... differs from the expected {expect_sha256[:16]}...",
                hint="copy the bundle again from the build host",
            )
    inner = os.path.join(folder, "bundle", BUNDLE_MANIFEST)
    if not os.path.exists(path) and os.path.isfile(inner):  # the build's output folder, one level above its bundle
        raise BundleInputError(
            "{} has no {}: it is a build's output folder, and its device bundle is {}".format(
                folder, BUNDLE_MANIFEST, os.path.join(folder, "bundle")
            ),
            hint="pass the bundle folder: {}".format(os.path.join(folder, "bundle")),
        )
    if manifest_bytes is None:
        raise BundleInputError(
            f"bundle manifest unreadable: {path} ({unreadable})", hint="copy the whole bundle folder again"
        )
    manifest = parse_json(manifest_bytes, path, "bundle manifest")
    if manifest.get("schema") != BUNDLE_SCHEMA:
        raise BundleInputError(f"{path} is not an edgedeploy bundle manifest (schema {manifest.get('schema')!r})")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise IntegrityFailed(f"{path}: no 'files' map; refusing the bundle")
    problems = []
    for name, sha in sorted(files.items()):
        p = bundle_path(folder, name)
        if not os.path.isfile(p):
            problems.append(f"{name} missing")
        elif sha256_file(p) != sha:
            problems.append(f"{name} sha256 differs from bundle.json (tampered or replaced)")
    for key in ("plan", "goldens"):
        if key in manifest:
            bundle_path(folder, manifest[key], key)
    allowed = set(files) | {BUNDLE_MANIFEST, ENGINE_RECORD, VALIDATION}
    allowed |= set(_device_outputs(folder, manifest))
    root = os.path.realpath(folder)
    for dirpath, dirnames, filenames in os.walk(root):
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for entry in sorted(filenames + links):
            rel = os.path.relpath(os.path.join(dirpath, entry), root).replace(os.sep, "/")
            if rel not in allowed:
                problems.append(f"{rel} is not listed in bundle.json (remove it)")
    if problems:
        raise IntegrityFailed(
            f"{folder}: " + "; ".join(problems), hint="copy the bundle again or rebuild it with 'deploy build'"
        )
    _VERIFIED.clear()
    _VERIFIED.update(folder=root, files=dict(files))
    return manifest


def validation_spec(manifest: Dict[str, Any]) -> Dict[str, Any]:
    """bundle.json's ``validation`` object, each field of the type the judge reads.

    Raises:
        BundleInputError: a field of another type (named).
    """
    spec = manifest.get("validation", {})
    if not isinstance(spec, dict):
        raise BundleInputError(f"bundle.json: 'validation' is not an object ({type(spec).__name__})")
    names = ("outputs", "classifier_outputs")
    for key in names:
        value = spec.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise BundleInputError(f"bundle.json: validation.{key} is not a list of output names ({value!r})")
    topk = spec.get("topk", 1)
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise BundleInputError(f"bundle.json: validation.topk is not a positive whole number ({topk!r})")
    tolerance = spec.get("tolerance", {})
    if not isinstance(tolerance, dict) or not all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in tolerance.values()
    ):
        raise BundleInputError(f"bundle.json: validation.tolerance is not an object of numbers ({tolerance!r})")
    return spec


MAX_GOLDENS_BYTES = 1 << 30  # what all of goldens.npz's arrays may declare together, uncompressed


def _check_declared_sizes(path: Any) -> None:
    """Every array header in the ``.npz`` at ``path`` read before any array: their declared sizes together stay
    under :data:`MAX_GOLDENS_BYTES` (a deflated member of a few MB can declare gigabytes).

    Raises:
        ValueError: a member that is not a NumPy array, or sizes over the bound.
        OSError: unreadable.
    """
    import zipfile

    from numpy.lib import format as npformat

    total = 0
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            with zf.open(info) as fh:
                version = npformat.read_magic(fh)
                read = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
                shape, _fortran, dtype = read(fh)
            count = 1
            for d in shape:
                count *= int(d)
            total += count * dtype.itemsize
            if total > MAX_GOLDENS_BYTES:
                over = f"{info.filename} brings the declared arrays to {total} bytes, over {MAX_GOLDENS_BYTES}"
                raise ValueError(over)


def load_goldens(path: str, content: Optional[bytes] = None) -> Dict[str, Dict[int, Dict[str, Dict[str, Any]]]]:
    """goldens.npz -> {point: {sample: {"in": {...}, "out": {...}, "sparse": {...}}}} (the reference stage's
    layout; seeded inputs regenerated, see ``parity.goldens_from_arrays``). ``content``: the file's bytes,
    already read (and verified); else ``path`` is read.

    Raises:
        BundleInputError: unreadable or not a goldens archive.
    """
    import io

    import numpy as np

    try:
        source = io.BytesIO(content) if content is not None else path  # type: Any
        _check_declared_sizes(source)
        if content is not None:
            source.seek(0)
        with np.load(source, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, MemoryError) as exc:
        raise BundleInputError(f"goldens unreadable: {path} ({exc})") from None
    try:
        return sibling("goldens_format").goldens_from_arrays(arrays)
    except ValueError as exc:
        raise BundleInputError(f"{path}: {exc}") from None


def build_with_retry(
    build: Callable[[int], bytes],
    workspace_mib: int,
    *,
    min_workspace_mib: int = 32,
    oom: Tuple[Type[BaseException], ...] = (),
    log: Callable[[str], None] = print,
) -> Tuple[bytes, int, List[int]]:
    """Call ``build(workspace_mib)``; on an out-of-memory error halve the workspace and try again.

    Returns:
        (engine bytes, the workspace that worked, every workspace tried).

    Raises:
        BuildFailed: still out of memory at ``min_workspace_mib`` (all sizes tried are named).
    """
    if not oom:
        oom = (sibling("trt_adapter").BuildOutOfMemoryError,)
    tried = []  # type: List[int]
    size = int(workspace_mib)
    while True:
        tried.append(size)
        try:
            return build(size), size, tried
        except oom as exc:
            smaller = size // 2
            if smaller < min_workspace_mib:
                raise BuildFailed(
                    f"engine build ran out of memory with every workspace tried ({', '.join(map(str, tried))} MiB): "
                    f"{exc}",
                    hint="free memory on the device (stop other processes, add swap) or simplify the model",
                ) from None
            log(f"engine build ran out of memory with a {size} MiB workspace; retrying with {smaller} MiB")
            size = smaller


def engine_record(
    engine_sha256: str,
    plan: Dict[str, Any],
    *,
    trt_version: str,
    device: Optional[Dict[str, str]],
    onnx_sha256: str,
    workspace_mib: int,
    build_seconds: float = 0.0,
) -> Dict[str, Any]:
    """The provenance written beside an engine (``engine.json``)."""
    return {
        "schema": ENGINE_SCHEMA,
        "engine": plan.get("engine", "model.engine"),
        "engine_sha256": engine_sha256,
        "tensorrt": trt_version,
        "gpu": {"name": (device or {}).get("name", ""), "sm": (device or {}).get("sm", "")},
        "target": plan.get("target", ""),
        "precision": plan.get("precision", ""),
        "strategy": plan.get("strategy", ""),
        "strongly_typed": bool(plan.get("strongly_typed")),
        "profiles": plan.get("inputs", []),
        "dla_core": plan.get("dla_core"),
        "workspace_mib": workspace_mib,
        "source_onnx": plan.get("onnx", ""),
        "source_onnx_sha256": onnx_sha256,
        "python": sys.version.split()[0],
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(build_seconds, 3),
    }


def _version_tuple(text: str) -> Tuple[int, ...]:
    out = []
    for part in str(text).split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def compat_problems(record: Dict[str, Any], trt_version: Optional[str], device: Optional[Dict[str, str]]) -> List[str]:
    """Why an engine described by ``record`` cannot load here (empty: it can).

    TensorRT engines load only in the TensorRT release that built them (major.minor.patch) and on
    a GPU of the same compute capability; a different GPU model of the same SM loads (TensorRT
    warns). Each problem names both sides.
    """
    problems = []
    built = str(record.get("tensorrt", ""))
    if not trt_version:
        problems.append(f"engine needs TensorRT {built}; TensorRT does not import here")
    elif _version_tuple(built)[:3] != _version_tuple(trt_version)[:3]:
        problems.append(f"engine built with TensorRT {built}, this machine runs TensorRT {trt_version}")
    gpu = record.get("gpu") or {}
    want_sm = str(gpu.get("sm", ""))
    if device is None:
        problems.append(f"engine built for a GPU with SM {want_sm or '?'} ({gpu.get('name', '')}); no CUDA GPU here")
    elif want_sm and device.get("sm") and want_sm != device.get("sm"):
        problems.append(
            f"engine built for SM {want_sm} ({gpu.get('name', '')}), this GPU is SM {device.get('sm')} "
            f"({device.get('name', '')})"
        )
    return problems


def check_engine(
    engine_path: str,
    record: Dict[str, Any],
    *,
    trt_version: Optional[str],
    device: Optional[Dict[str, str]],
) -> None:
    """Verify an engine file before it is deserialized: its sha256, then TensorRT and GPU compatibility.

    Raises:
        IntegrityFailed: the engine's bytes differ from the record (engines are executable artifacts).
        EngineIncompatible: built for another TensorRT version or GPU (both sides named).
    """
    if not os.path.isfile(engine_path):
        raise BundleInputError(f"engine not found: {engine_path}")
    got = sha256_file(engine_path)
    if got != record.get("engine_sha256"):
        raise IntegrityFailed(
            f"{engine_path}: sha256 {got[:16]}... differs from {ENGINE_RECORD} "
            f"({str(record.get('engine_sha256'))[:16]}...); refusing to deserialize it",
            hint="rebuild the engine with complete_bundle.py",
        )
    problems = compat_problems(record, trt_version, device)
    if problems:
        raise EngineIncompatible("; ".join(problems), hint="rebuild the engine on this machine: complete_bundle.py .")


class OrtRunner:
    """Stand-in for the engine: an ONNX Runtime CPU session on the plan's ONNX model.

    A Q/DQ model runs as its operators define it (float arithmetic between each DequantizeLinear and
    QuantizeLinear; ONNX Runtime's own INT8 fusions off), as the precision stage judged it: ONNX Runtime's INT8
    kernels are not the engine's either.
    """

    label = "onnxruntime (stand-in: no engine built)"

    def __init__(self, onnx_path: str, shown: Optional[str] = None) -> None:
        """``shown``: the name messages give the model (``onnx_path`` may be a private copy's)."""
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise BundleInputError(
                f"--runner onnxruntime needs onnxruntime ({exc})", hint="pip install onnxruntime"
            ) from None
        try:
            options = ort.SessionOptions()
            if hasattr(options, "add_session_config_entry"):  # onnxruntime >= 1.5
                options.add_session_config_entry("session.disable_quant_qdq", "1")
            self.session = ort.InferenceSession(onnx_path, sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own untyped errors
            text = " ".join(str(exc).replace(os.path.dirname(onnx_path) + os.sep, "").split())
            raise BuildFailed(f"ONNX Runtime cannot load {shown or onnx_path}: {text[:300]}") from None
        types = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64"}
        types.update({"tensor(int32)": "int32", "tensor(bool)": "bool"})
        self.dtypes = {i.name: types.get(i.type, "float32") for i in self.session.get_inputs()}
        self.names = [o.name for o in self.session.get_outputs()]

    def infer(self, feeds: Dict[str, Any]) -> Dict[str, Any]:
        try:
            cast = {k: v.astype(self.dtypes.get(k, v.dtype)) for k, v in feeds.items()}
            return dict(zip(self.names, self.session.run(self.names, cast)))
        except Exception as exc:  # onnxruntime raises its own untyped errors (a golden input of the wrong shape)
            raise BuildFailed(f"running the model failed ({self.label}): {_one_line(exc)}") from None

    def close(self) -> None:
        return None


# What the TensorRT bindings, the CUDA driver calls (trt_runner.CudaError is a RuntimeError) and the
# device's numpy raise when an engine cannot be opened or run: TensorRT's own errors are RuntimeError or
# TypeError (pybind11), a binding a release lacks is AttributeError (e.g. TensorRT 8.x's trt.nptype on
# numpy 1.24 - 1.26), a shape outside the profile ValueError, a missing input KeyError.
RUNNER_FAILURES = (RuntimeError, TypeError, ValueError, KeyError, AttributeError, MemoryError, OSError)
RUNNER_HINT = "run again with --verbose for TensorRT's messages, and check the device's TensorRT and numpy versions"


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"


class TrtRunner:
    """The engine, deserialized and run.

    TensorRT >= 8.5: polygraphy's runner when polygraphy imports, else the bundled ``trt_runner``
    (named-tensor API). TensorRT < 8.5 (Jetson Nano, 8.2): always ``trt_runner``'s bindings API,
    since no polygraphy release runs there (0.48 dropped TensorRT < 8.5; the one pip picks on
    Python 3.6 raises SyntaxError on import). ``trt_runner`` moves memory with ``libcuda.so.1``.
    """

    label = "tensorrt"

    def __init__(self, engine_bytes: bytes, trt_version: str = "", log: Callable[[str], None] = print) -> None:
        adapter = sibling("trt_adapter")
        version = trt_version or adapter.tensorrt_version() or ""
        self.session = None  # type: Any
        if adapter.version_tuple(version)[:2] >= (8, 5):
            try:
                self.session = adapter.EngineSession(engine_bytes)
                self.label = "tensorrt (polygraphy)"
            except (adapter.TensorRTUnavailable, adapter.EngineBuildError) as exc:
                # polygraphy missing, not importable on this Python, or unable to run here (it loads
                # libcudart itself): the bundled runner needs only TensorRT and libcuda.so.1
                log(f"note: {exc}; running the engine with the bundled trt_runner.py instead")
        if self.session is None:
            runner = sibling("trt_runner")
            try:
                self.session = runner.open_session(engine_bytes)
            except RUNNER_FAILURES as exc:
                raise BuildFailed(f"cannot run the engine: {_one_line(exc)}", hint=RUNNER_HINT) from None
            self.label = f"tensorrt ({self.session.api})"
        self.dtypes = self.session.input_dtypes()

    def infer(self, feeds: Dict[str, Any]) -> Dict[str, Any]:
        cast = {k: v.astype(self.dtypes.get(k, v.dtype)) for k, v in feeds.items()}
        try:
            return self.session.infer(cast)
        except RUNNER_FAILURES as exc:
            raise BuildFailed(f"running the engine failed ({self.label}): {_one_line(exc)}", hint=RUNNER_HINT) from None

    def close(self) -> None:
        self.session.close()


def validate(runner: Any, goldens: Dict[str, Any], spec: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Run every golden input through ``runner``; one comparison row per (point, sample, output)."""
    parity = sibling("parity")
    cases = [(point, sample, goldens[point][sample]) for point in sorted(goldens) for sample in sorted(goldens[point])]
    results = [runner.infer(pair["in"]) for _, _, pair in cases]
    # the one judge the host used: FP16/INT8 agreement on real-sample goldens, pooled top-1 over them
    return parity.judge_goldens(
        cases,
        results,
        str(spec.get("precision") or "fp32"),
        spec.get("tolerance", {}),
        outputs=spec.get("outputs") or None,
        topk=int(spec.get("topk", 1)),
        classifier_outputs=spec.get("classifier_outputs", []),
    )


def latency_ms(runner: Any, feeds: Dict[str, Any], iters: int, warmup: int = 3) -> Dict[str, Any]:
    """p50 / p90 / p99 milliseconds of ``runner.infer`` on one feed (host-side, copies included)."""
    import numpy as np

    for _ in range(warmup):
        runner.infer(feeds)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        runner.infer(feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return {
        "p50_ms": float(np.percentile(times, 50)),
        "p90_ms": float(np.percentile(times, 90)),
        "p99_ms": float(np.percentile(times, 99)),
        "iters": iters,
        "shape": {k: list(v.shape) for k, v in feeds.items()},
    }


def plan_shape_values(plan: Dict[str, Any]) -> Dict[str, List[List[int]]]:
    """The plan's ``shape_values`` (input -> [min, opt, max] value lists), checked.

    Raises:
        BundleInputError: not a table of three equally long lists of whole numbers per input.
    """
    raw = plan.get("shape_values") or {}
    ok = isinstance(raw, dict)
    for triple in raw.values() if ok else ():
        ok = ok and isinstance(triple, list) and len(triple) == 3
        ok = ok and all(isinstance(v, list) and len(v) == len(triple[0]) for v in triple)
        ok = ok and all(isinstance(n, int) and not isinstance(n, bool) for v in triple for n in v)
    if not ok:
        raise BundleInputError(
            "plan.json: 'shape_values' is not input -> [min, opt, max] lists of whole numbers",
            hint="rebuild the bundle with deploy build",
        )
    return {str(k): v for k, v in raw.items()}


def plan_profiles(plan: Dict[str, Any]) -> List[Dict[str, Tuple[Tuple[int, ...], ...]]]:
    """The plan's optimization profile (one, or none for a static model): where the shapes vary, or where the
    ONNX input dims are symbolic (TensorRT fails a network with a -1 input dim and no profile)."""
    if any(i.get("symbolic") or i["min"] != i["max"] or i["min"] != i["opt"] for i in plan["inputs"]):
        return [{i["name"]: (tuple(i["min"]), tuple(i["opt"]), tuple(i["max"])) for i in plan["inputs"]}]
    return []


def _build_engine(folder: str, plan: Dict[str, Any], args: argparse.Namespace, log: Callable[[str], None]) -> str:
    """Build the plan's engine into ``folder``; write engine.json; return the engine's path."""
    profiles = plan_profiles(plan)
    timing_name = plan.get("timing_cache") or "timing.cache"
    listed = not args.timing_cache and timing_name in (_VERIFIED.get("files") or {})
    # TensorRT reads the model, its external data, the calibration cache and a listed timing cache as verified:
    # private copies, hashed as copied; an unlisted timing cache in the bundle is never read (it is rewritten)
    reads = model_files(plan["onnx"]) + [plan["calib_cache"]] * bool(plan.get("calib_cache")) + [timing_name] * listed
    private = verified_copies(reads, "build from it")
    try:
        return _build_from(folder, private, plan, profiles, timing_name, args, log)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _build_from(
    folder: str,
    private: str,
    plan: Dict[str, Any],
    profiles: List[Dict[str, Tuple[Tuple[int, ...], ...]]],
    timing_name: str,
    args: argparse.Namespace,
    log: Callable[[str], None],
) -> str:
    """:func:`_build_engine`'s build, from the verified copies in ``private``."""
    adapter = sibling("trt_adapter")
    onnx_path = os.path.join(private, *plan["onnx"].split("/"))
    calib = os.path.join(private, *plan["calib_cache"].split("/")) if plan.get("calib_cache") else None
    timing = args.timing_cache or os.path.join(private, *timing_name.split("/"))
    shape_values = plan_shape_values(plan)

    def build(workspace: int) -> bytes:
        return adapter.build_serialized_engine(
            onnx_path,
            profiles=profiles,
            precision=plan["precision"],
            strongly_typed=bool(plan.get("strongly_typed")),
            workspace_mib=workspace,
            calib_cache=calib,
            fp32_layers=plan.get("fp32_layers") or (),
            optimization_level=plan.get("optimization_level"),
            timing_cache=timing,
            dla_core=plan.get("dla_core"),
            gpu_fallback=bool(plan.get("gpu_fallback", True)),
            shape_values=shape_values,
            log=log if args.verbose else None,
            warn=log,
        )

    log(f"building {plan['engine']} from {plan['onnx']} ({plan['precision']}, {plan['strategy']})")
    t0 = time.perf_counter()
    try:
        data, used, tried = build_with_retry(
            build,
            int(args.workspace_mib or plan["workspace_mib"]),
            min_workspace_mib=int(plan.get("min_workspace_mib", 32)),
            oom=(adapter.BuildOutOfMemoryError,),
            log=log,
        )
    except adapter.EngineBuildError as exc:
        text = str(exc).replace(private + os.sep, "")  # the bundle's names, not the private copies'
        raise BuildFailed(text, hint="see the TensorRT messages above (run with --verbose for all)") from None
    seconds = time.perf_counter() - t0
    engine_path = os.path.join(folder, plan["engine"])
    write_bytes(engine_path, data)
    listed = timing_name in (_VERIFIED.get("files") or {})
    if not args.timing_cache and not listed and os.path.isfile(timing):  # TensorRT's new cache: a device output
        with open(timing, "rb") as fh:
            write_bytes(os.path.join(folder, *timing_name.split("/")), fh.read())
    record = engine_record(
        hashlib.sha256(data).hexdigest(),
        plan,
        trt_version=adapter.tensorrt_version() or "",
        device=adapter.cuda_device(),
        onnx_sha256=_VERIFIED["files"][plan["onnx"]],
        workspace_mib=used,
        build_seconds=seconds,
    )
    record["workspaces_tried_mib"] = tried
    write_json(os.path.join(folder, ENGINE_RECORD), record)
    log(f"built {engine_path} in {seconds:.1f}s ({len(data) / 1e6:.1f} MB, workspace {used} MiB)")
    return engine_path


def _print_table(rows: List[Dict[str, Any]], label: str, log: Callable[[str], None]) -> None:
    log(f"{'runner':<12} {'shape':<6} {'sample':<6} {'output':<16} {'max_abs':>10} {'cosine':>9}  result")
    for r in rows:
        max_abs = r.get("max_abs")
        cosine = r.get("cosine")
        log(
            f"{label.split()[0]:<12} {r['shape']:<6} {'all' if r['sample'] is None else r['sample']:<6} "
            f"{r['output']:<16} "
            f"{'-' if max_abs is None else format(max_abs, '.3e'):>10} "
            f"{'-' if cosine is None else format(cosine, '.6f'):>9}  "
            f"{('info' if r.get('informational') else 'ok') if r.get('passed') else 'FAIL'}"
        )


def run(args: argparse.Namespace, log: Callable[[str], None]) -> Dict[str, Any]:
    """The whole device step; returns the validation record.

    Raises:
        BundleError: a subclass with edgedeploy's exit code.
    """
    folder = os.path.abspath(args.bundle)
    manifest = verify_bundle(folder, args.bundle_sha256)
    log(f"bundle verified: {len(manifest.get('files', {}))} files match {BUNDLE_MANIFEST}")
    if getattr(args, "verify_only", False):  # e.g. before `sh trtexec.sh`, which runs bundle content unchecked
        return {"status": "verified", "files": len(manifest.get("files", {}))}
    plan_name = manifest.get("plan", PLAN)
    plan_path = bundle_path(folder, plan_name, "plan")
    plan = parse_json(verified_bytes(str(plan_name), "build from it"), plan_path, "build plan")
    for key in ("onnx", "calib_cache", "engine", "timing_cache"):  # names the steps below open or write
        if plan.get(key):
            bundle_path(folder, plan[key], key)
    unverified = [plan[k] for k in ("onnx", "calib_cache") if plan.get(k) and plan[k] not in manifest["files"]]
    if unverified:
        raise IntegrityFailed(f"plan.json names {unverified}, which bundle.json does not list; refusing the bundle")
    goldens_name = manifest.get("goldens", "goldens.npz")
    goldens_path = bundle_path(folder, goldens_name, "goldens")
    # the bytes verified are the bytes judged with: read once, hashed as read
    goldens = load_goldens(goldens_path, verified_bytes(str(goldens_name), "judge with it"))
    spec = dict(validation_spec(manifest), precision=plan.get("precision") or "fp32")
    record = None
    proved = None  # what the run proves: the ONNX Runtime stand-in proves the model it runs, not the engine
    if args.runner == "onnxruntime":
        dry_run = manifest.get("dry_run") or {}
        if not isinstance(dry_run, dict):
            raise BundleInputError(f"bundle.json: 'dry_run' is not an object ({type(dry_run).__name__})")
        onnx_name = dry_run.get("onnx") or plan["onnx"]
        if onnx_name not in manifest["files"]:
            raise IntegrityFailed(f"bundle.json's dry run names {onnx_name!r}, which it does not list; refusing")
        proved = dry_run.get("proves") or "{}: the plan's ONNX model".format(plan.get("precision"))
        shown = bundle_path(folder, onnx_name, "dry-run model")
        # the session reads the model as verified: a private copy, hashed as copied (loaded whole, then removed)
        private = verified_copies(model_files(str(onnx_name)), "run the dry run on it")
        try:
            runner = OrtRunner(os.path.join(private, *str(onnx_name).split("/")), shown)  # type: Any
        finally:
            shutil.rmtree(private, ignore_errors=True)
        log(f"runner: {runner.label} on {onnx_name} (proves {proved})")
    else:
        adapter = sibling("trt_adapter")
        trt_version = adapter.tensorrt_version()
        device = adapter.cuda_device()
        if not trt_version:
            raise BuildFailed(
                "TensorRT's Python bindings do not import here",
                hint="run this on the device (JetPack ships python3-libnvinfer), or --runner onnxruntime for a dry run",
            )
        want_sm = plan.get("sm") or ""
        if want_sm and device and device.get("sm") != want_sm:
            raise EngineIncompatible(
                f"bundle is for target {plan.get('target')} (SM {want_sm}, TensorRT {plan.get('trt_version')}); "
                f"this GPU is {device.get('name')} (SM {device.get('sm')}) with TensorRT {trt_version}",
                hint="build a bundle for this device's target with deploy build --target ...",
            )
        if _version_tuple(trt_version)[:2] != _version_tuple(plan.get("trt_version", ""))[:2]:
            log(
                f"warning: target {plan.get('target')} expects TensorRT {plan.get('trt_version')}, "
                f"this machine has {trt_version}; the engine is built for and recorded as {trt_version}"
            )
        engine_path = os.path.abspath(args.engine) if args.engine else _build_engine(folder, plan, args, log)
        record = read_json(os.path.join(os.path.dirname(engine_path), ENGINE_RECORD), "engine record")
        check_engine(engine_path, record, trt_version=trt_version, device=device)
        with open(engine_path, "rb") as fh:
            runner = TrtRunner(fh.read(), trt_version, log)
        log(f"runner: TensorRT {trt_version} on {device.get('name') if device else '?'}")
    try:
        rows = validate(runner, goldens, spec)
        latency = None
        if args.runner == "tensorrt" and args.latency_iters > 0 and "opt" in goldens:
            latency = latency_ms(runner, goldens["opt"][min(goldens["opt"])]["in"], args.latency_iters)
    finally:
        runner.close()
    failures = [r for r in rows if not r.get("passed")]
    if not any(r.get("sample") is not None for r in rows):
        # nothing compared (no golden, or outputs that name none): a check that judged nothing never passes
        failures.append(
            {"passed": False, "shape": "all", "sample": None, "output": "-", "reason": "no golden was compared"}
        )
        rows.append(failures[-1])
    result = {
        "runner": runner.label,
        "status": "passed" if not failures else "failed",
        "precision": plan.get("precision"),
        "proved": proved or "{}: the engine".format(plan.get("precision")),
        "tolerance": spec.get("tolerance", {}),
        "engine": record,
        "checks": rows,
        "latency": latency,
    }
    write_json(os.path.join(folder, VALIDATION), result)
    _print_table(rows, runner.label, log)
    if latency:
        lat = latency
        log(f"latency (host-side, {lat['iters']} runs): p50 {lat['p50_ms']:.3f} ms, p99 {lat['p99_ms']:.3f} ms")
    if failures:
        parity = sibling("parity")
        worst = "; ".join(f"{parity.where(r)} {r['output']}: {r.get('reason')}" for r in failures[:4])
        raise ParityFailed(
            f"{len(failures)} of {len(rows)} checks against the PyTorch goldens failed ({runner.label}): {worst}",
            hint=f"see {os.path.join(folder, VALIDATION)}",
        )
    log(f"PASSED: {len(rows)} checks against the PyTorch goldens ({runner.label}; proved {result['proved']})")
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="complete_bundle.py", description=__doc__.split("\n")[0])
    p.add_argument("bundle", nargs="?", default=os.path.dirname(os.path.abspath(__file__)), help="bundle folder")
    p.add_argument("--runner", choices=("tensorrt", "onnxruntime"), default="tensorrt", help="what runs the model")
    p.add_argument("--engine", default=None, help="validate this engine (with its engine.json) instead of building")
    p.add_argument("--workspace-mib", type=int, default=None, help="override the plan's builder workspace")
    p.add_argument("--timing-cache", default=None, help="timing cache file to reuse across builds")
    p.add_argument("--bundle-sha256", default=None, help="expected sha256 of bundle.json (printed by deploy build)")
    p.add_argument("--latency-iters", type=int, default=20, help="timed engine runs after validation (0: none)")
    p.add_argument("--verbose", action="store_true", help="print TensorRT's builder messages")
    p.add_argument("--verify-only", action="store_true", help="check the bundle's files, then stop (exit 0 or 9)")
    return p


def main(argv: Optional[List[str]] = None, log: Optional[Callable[[str], None]] = None) -> int:
    """Entry point; returns the process exit code."""
    args = parser().parse_args(argv)
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        run(args, say)
    except BundleError as exc:
        say(f"complete_bundle: {exc.one_line()}")
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
