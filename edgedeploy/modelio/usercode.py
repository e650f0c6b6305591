"""The one loader of user code: model factories and calibration callables.

A module that lives in ``model.python_path`` is loaded by file location under a name unique to
that file (``edgedeploy_user_<hash>_<name>``), so two projects that both have a ``tinynet.py`` get
two modules in one process. ``sys.path`` holds the project roots only while the module executes
(so its own ``import helper`` works) and is restored afterwards.

While it executes, the project's modules (files under the roots) that are already in ``sys.modules``
are set aside, so it imports them afresh from disk: what a new process would do, and what the hashed
files describe. Afterwards the modules the user's own process had imported (a notebook that ran
``import tinynet`` before ``edgedeploy.build()``) are put back: the user's session keeps the very
module objects it holds, and the build uses the code on disk. Modules this loader imported itself stay
in ``sys.modules`` until the next build starts (:func:`forget`); the user's are never dropped.

User files are always compiled from their source, never from a ``.pyc``: Python trusts a cached
``.pyc`` when the source's size and modification time in whole seconds match, so an edit that keeps
the file's size within the same second (``SCALE = 1.0`` -> ``0.5`` by a script right after a build)
would run the old code while the cache key hashes the new file. Nothing is written into the project's
``__pycache__`` by a build either.

The factory (and a calibration callable) runs under the same rules (:func:`running_user_code`), so an
import it makes only when called (``from .layers import Net`` inside ``build()``) reads the project on disk.

Every user module the loaded module depends on is recorded (:mod:`edgedeploy.modelio.userfiles`): the
ones the load imported, the ones it found already imported, and project files its import statements name
that nothing imported yet (the factory's late imports). Those files are the user's code,
hashed into the cache key and listed in the manifest. User modules outside ``model.python_path``
that were already imported are used as the process has them (they are hashed and listed, not
re-imported: put their folder in ``model.python_path`` to have each build read them from disk).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

from edgedeploy.artifacts import CALIB_CODE, MODEL_CODE
from edgedeploy.config import DeployConfig, module_file_in_roots
from edgedeploy.errors import ConfigError
from edgedeploy.fileio.hashing import sha256_file
from edgedeploy.modelio import reads
from edgedeploy.modelio.userfiles import changed_since_import, project_modules, user_dependencies, user_file

_LOADED: set[str] = set()  # sys.modules names this loader added (dropped by forget())
# (spec, roots) -> the loaded callable and the sha256 of each of its files when it was loaded
_CALLABLES: dict[tuple[str, tuple[str, ...]], tuple[LoadedCallable, tuple[str, ...]]] = {}


@dataclass(frozen=True)
class LoadedCode:
    """A loaded user module and the user source files the load imported (the module's own first)."""

    module: ModuleType
    files: tuple[Path, ...]


@dataclass(frozen=True)
class LoadedFactory:
    """The model factory callable and the user source files loading it imported."""

    factory: Any
    files: tuple[Path, ...]


@dataclass(frozen=True)
class LoadedCallable:
    """A ``module:callable`` from the config and the user source files loading it imported."""

    fn: Any
    files: tuple[Path, ...]


def forget() -> None:
    """Drop every module this loader imported from ``sys.modules`` (a new build imports them afresh)."""
    for name in sorted(_LOADED):
        sys.modules.pop(name, None)
    _LOADED.clear()
    _CALLABLES.clear()
    importlib.invalidate_caches()


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Loads a user file compiled from its source every time (no ``.pyc`` read or written)."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


class _ProjectSourceFinder(importlib.abc.MetaPathFinder):
    """Finds modules the way ``sys.path`` does, and gives those whose file lies under ``roots`` a
    :class:`_SourceOnlyLoader` (others are left to the regular finders)."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = [r.resolve() for r in roots]
        self._in_project: dict[str, bool] = {}  # package folder -> whether it lies under a root

    def _project_folder(self, folder: str) -> bool:
        if folder not in self._in_project:
            real = Path(folder).resolve()
            self._in_project[folder] = any(real.is_relative_to(r) or r.is_relative_to(real) for r in self.roots)
        return self._in_project[folder]

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if path is not None and not any(self._project_folder(str(folder)) for folder in path):
            # a submodule of a package outside the project (transformers imports thousands): the regular
            # finders' alone, not searched twice
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or type(spec.loader) is not importlib.machinery.SourceFileLoader:
            return None
        origin = Path(spec.origin).resolve()
        if not any(origin.is_relative_to(r) for r in self.roots):
            return None
        spec.loader = _SourceOnlyLoader(fullname, spec.origin)
        return spec


def _unique_name(file: Path) -> str:
    digest = hashlib.sha256(str(file).encode()).hexdigest()[:12]
    return f"edgedeploy_user_{digest}_{file.stem}"


@contextmanager
def _project_imports(roots: list[Path], *, set_aside_ours: bool) -> Iterator[list[ModuleType]]:
    """Within the block, ``sys.path`` starts with ``roots`` and the project's modules already imported are
    set aside, so imports read them from disk; yields the list that, after the block, holds the user modules
    it imported. Afterwards ``sys.path`` is restored, the user's own modules are put back, and the ones
    imported here are this loader's (dropped by :func:`forget`).

    Args:
        set_aside_ours: also set aside the modules this loader imported (a new load); False while the
            factory runs, which imports what it needs next to the modules its load just imported.
    """
    set_aside = {n: m for n, m in project_modules(roots).items() if set_aside_ours or n not in _LOADED}
    for name in set_aside:
        del sys.modules[name]
    users = {n for n in set_aside if n not in _LOADED}  # imported by the user's process: never ours to drop
    before = set(sys.modules)
    saved = list(sys.path)
    sys.path[:0] = [str(r) for r in roots]
    finder = _ProjectSourceFinder(roots)
    sys.meta_path.insert(0, finder)
    fresh: list[ModuleType] = []
    try:
        yield fresh
    finally:
        sys.meta_path.remove(finder)
        sys.path[:] = saved
        new = sorted(n for n in set(sys.modules) - before if user_file(sys.modules.get(n)) is not None)
        fresh.extend(sys.modules[n] for n in new)
        for name, old in set_aside.items():
            if name in users or name not in sys.modules:
                sys.modules[name] = old  # the user's module, or one an earlier load imported and this one did not
        # a fresh submodule of a package the user imported is not left behind: the user's package object
        # lacks it as an attribute, so their own `import pkg.sub; pkg.sub` would fail
        orphans = {n for n in new if n not in users and any(p in users for p in _parents(n))}
        for name in orphans:
            del sys.modules[name]
        _LOADED.update(n for n in new if n not in users and n not in orphans)


@contextmanager
def running_user_code(cfg: DeployConfig, group: str) -> Iterator[None]:
    """Run user code (the model factory) the way it was loaded: what it imports late (``from .layers
    import Net`` inside ``build()``) comes from the project on disk, never from a stale module in
    ``sys.modules``, and is this loader's to drop at the next build. What it reads from disk is recorded for
    the build's input group ``group`` (:mod:`edgedeploy.modelio.reads`).
    """
    with _project_imports(_roots(cfg), set_aside_ours=False), reads.recording(group, runs=True):
        yield


def _roots(cfg: DeployConfig) -> list[Path]:
    return [r for r in (cfg.path(p) for p in cfg.model.python_path) if r is not None]


def load_module(module_name: str, roots: list[Path]) -> LoadedCode:
    """Import ``module_name``: by file location when it lives under ``roots``, else by name.

    ``sys.path`` is prefixed with ``roots`` only for the duration of the import. The project's modules
    already in ``sys.modules`` are set aside meanwhile and the user's own put back afterwards (see the
    module docstring), so an edited helper is read from disk even when the user's process imported it.

    Raises:
        Exception: whatever the module raises while it executes (callers wrap it in their error).
    """
    importlib.invalidate_caches()  # a file written since the last import must be seen
    file = module_file_in_roots(module_name, roots)
    with _project_imports(roots, set_aside_ours=True) as fresh:
        if file is not None and file.name != "__init__.py" and "." not in module_name:
            name = _unique_name(file)
            spec = importlib.util.spec_from_file_location(name, file, loader=_SourceOnlyLoader(name, str(file)))
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {file}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # classes must be findable by __module__ (inspect, TorchScript)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    own = getattr(module, "__file__", None)
    files = [Path(own).resolve()] if own else []  # the module itself, even from a package (the zoo)
    deps = user_dependencies(module, fresh, roots)
    files += [f for f in deps if f not in files]
    _refuse_stale(deps, fresh, roots)
    return LoadedCode(module=module, files=tuple(files))


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _refuse_stale(deps: dict[Path, ModuleType | None], fresh: list[ModuleType], roots: list[Path]) -> None:
    """A user module outside ``roots`` that was already imported is used as imported: refuse to build when
    its file changed since (the artifact would not match the hashed file, and the cache would keep it).

    Raises:
        ConfigError: naming the module, its file, and the fixes.
    """
    real = [r.resolve() for r in roots]
    done = {id(m) for m in fresh}
    for file, m in deps.items():
        if m is None or id(m) in done or any(file.is_relative_to(r) for r in real):
            continue  # read from disk by this load (the project's modules always are)
        if changed_since_import(file, m):
            raise ConfigError(
                f"{file} changed on disk since this process imported module {m.__name__!r}; "
                "the build would use the old code",
                hint=f"restart the process (or importlib.reload {m.__name__} and the modules importing from it), "
                f"or add {file.parent} to model.python_path so every build reads it from disk",
            )


def load_factory(cfg: DeployConfig) -> LoadedFactory:
    """Load the ``module:callable`` model factory named in the config, with the files it imported.

    A factory that came from a checkpoint sidecar is checked before anything runs: its module
    must be a file inside ``model.python_path`` (or the package's own zoo), and the callable must
    be a function or class defined in that module (not, say, ``os.system`` re-exported there).

    Raises:
        ConfigError: the module does not import, has no such callable, or a sidecar factory
            resolves outside the allowed roots.
    """
    module_name, _, attr = cfg.model.factory.partition(":")
    roots = [r for r in (cfg.path(p) for p in cfg.model.python_path) if r is not None]
    origin = getattr(cfg, "factory_origin", "config")  # train configs name their factory themselves
    where = f"{cfg.source}: key 'model.factory'"
    expected: Path | None = None
    if origin == "sidecar":
        where = f"{cfg.source}: model.factory from the checkpoint sidecar"
        expected = module_file_in_roots(module_name, roots)
        found = None
        if expected is None and "." not in module_name:
            spec = importlib.util.find_spec(module_name)
            found = Path(spec.origin).resolve() if spec is not None and spec.origin else None
        if expected is None:
            raise ConfigError(
                f"{where}: module {module_name!r} resolves to {found}, outside model.python_path",
                hint="set model.factory in the config if you trust it",
            )
    if origin != "sidecar":
        module_source(cfg, cfg.model.factory, "model.factory")  # "cannot find module" before running anything
    try:
        with reads.recording(MODEL_CODE):  # what the module reads as it imports is the model's too
            loaded = load_module(module_name, roots)
    except ConfigError:  # a stale module (see _refuse_stale): already one clear line
        raise
    except Exception as exc:  # any import-time failure is the user's factory
        raise ConfigError(
            f"{where}: cannot import module {module_name!r} ({type(exc).__name__}: {exc})",
            hint="check the module name and model.python_path",
        ) from None
    module = loaded.module
    if origin == "sidecar" and loaded.files[:1] != (expected,):
        raise ConfigError(
            f"{where}: module {module_name!r} resolves to {loaded.files[:1]}, outside model.python_path",
            hint="set model.factory in the config if you trust it",
        )
    factory = getattr(module, attr, None)
    if not callable(factory):
        import difflib

        names = [n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n, None))]
        close = difflib.get_close_matches(attr, names, n=1)
        raise ConfigError(
            f"{where}: module {module_name!r} has no callable {attr!r}",
            hint=f"did you mean {module_name}:{close[0]}?" if close else None,
        )
    if origin != "config" and not (
        (inspect.isfunction(factory) or inspect.isclass(factory)) and factory.__module__ == module.__name__
    ):
        raise ConfigError(
            f"{where}: {cfg.model.factory!r} is not a function or class defined in {module_name!r}",
            hint="a sidecar may only name the project's own model builders; set model.factory in the config",
        )
    return LoadedFactory(factory=factory, files=loaded.files)


def import_factory(cfg: DeployConfig) -> Any:
    """The model factory callable (see :func:`load_factory`).

    Raises:
        ConfigError: as :func:`load_factory`.
    """
    return load_factory(cfg).factory


def load_callable_code(cfg: DeployConfig, spec: str, key: str) -> LoadedCallable:
    """Load a ``module:callable`` named by config key ``key`` (e.g. ``precision.calib_callable``), with the
    user files it depends on (hashed into the cache key of the stages that call it, listed in the manifest).

    Loaded once while its files stay as they are: a second call returns the same callable unless one of
    the files changed on disk (then the module is loaded afresh), and :func:`forget` starts over.

    Raises:
        ConfigError: ``spec`` is not ``module:callable``, the module does not import, or it has no such callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not (sep and module_name and attr):
        raise ConfigError(f"{cfg.source}: key '{key}' = {spec!r} must be 'module:callable'")
    roots = [r for r in (cfg.path(p) for p in cfg.model.python_path) if r is not None]
    memo = (spec, tuple(str(r) for r in roots))
    if memo in _CALLABLES:
        loaded, shas = _CALLABLES[memo]
        if shas == _shas(loaded.files):
            return loaded
    try:
        with reads.recording(CALIB_CODE):
            code = load_module(module_name, roots)
        fn = getattr(code.module, attr)
    except ConfigError:
        raise
    except Exception as exc:  # user code: any import-time failure is theirs
        raise ConfigError(f"{cfg.source}: key '{key}': cannot load {spec!r} ({type(exc).__name__}: {exc})") from None
    if not callable(fn):
        raise ConfigError(f"{cfg.source}: key '{key}': {spec!r} is not callable")
    loaded = LoadedCallable(fn=fn, files=code.files)
    _CALLABLES[memo] = (loaded, _shas(loaded.files))
    return loaded


def _shas(files: tuple[Path, ...]) -> tuple[str, ...]:
    return tuple(sha256_file(f) if f.is_file() else "" for f in files)


def load_callable(cfg: DeployConfig, spec: str, key: str) -> Any:
    """The callable of :func:`load_callable_code`.

    Raises:
        ConfigError: as :func:`load_callable_code`.
    """
    return load_callable_code(cfg, spec, key).fn


def module_source(cfg: DeployConfig, spec: str, key: str) -> Path | None:
    """The source file of the module in ``spec`` (``module:callable``), without importing it (for cache keys).

    Raises:
        ConfigError: the module cannot be found on ``model.python_path`` or the installed packages.
    """
    module_name = spec.partition(":")[0]
    roots = [r for r in (cfg.path(p) for p in cfg.model.python_path) if r is not None]
    found = module_file_in_roots(module_name, roots)
    if found is not None:
        return found
    try:
        mspec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as exc:
        raise ConfigError(
            f"{cfg.source}: key '{key}': cannot find module {module_name!r} ({exc})",
            hint="check the module name and model.python_path",
        ) from None
    if mspec is None:
        raise ConfigError(
            f"{cfg.source}: key '{key}': cannot find module {module_name!r}",
            hint="check the module name and model.python_path",
        )
    if mspec.origin and mspec.origin not in ("built-in", "frozen") and Path(mspec.origin).is_file():
        return Path(mspec.origin)
    return None


def factory_source(cfg: DeployConfig) -> Path | None:
    """The source file of the model factory's module, without importing it.

    Raises:
        ConfigError: the module cannot be found on the configured python path.
    """
    return module_source(cfg, cfg.model.factory, "model.factory")
