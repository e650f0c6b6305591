"""Which loaded modules are the user's code, and which of them a loaded module depends on.

Used by :mod:`edgedeploy.modelio.usercode`. A user file is a ``.py`` file outside the standard library,
site-packages and edgedeploy itself. A loaded module's user dependencies are found two ways, because
the import machinery alone misses modules that were already in ``sys.modules`` (a notebook that
imported the model and its helpers before calling ``edgedeploy.build()``): the modules the load
imported afresh, and a walk from the loaded module through every user module it reaches, by its
globals (``import helper``, ``from helper import act``) and by the import statements in its source
(``from helper import SCALE``, imports inside functions), resolved against ``sys.modules`` or, for a
module nothing imported yet (an import the factory makes only when it runs), found by file in the
project's folders. Nothing here imports or executes anything.
"""

from __future__ import annotations

import ast
import functools
import os
import site
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType

from edgedeploy.config import module_file_in_roots
from edgedeploy.fileio.hashing import sha256_file

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_RUNNING = ("__main__", "__mp_main__")  # the running script: never set aside, even when it lives in the project


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    dirs = {str(_PACKAGE_DIR)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.update((p, os.path.realpath(p)))
    try:
        dirs.update(q for p in site.getsitepackages() for q in (p, os.path.realpath(p)))
    except AttributeError:  # virtualenv's old site module
        pass
    return tuple(d.rstrip(os.sep) + os.sep for d in dirs)


def _library_path(path: str) -> bool:
    parts = Path(path).parts
    return "site-packages" in parts or "dist-packages" in parts or path.startswith(_library_dirs())


def is_user_file(path: str | Path) -> bool:
    """True for a Python source file outside the standard library, site-packages and edgedeploy."""
    s = str(path)
    # string checks first: this runs over every module in sys.modules, most of them library code
    if not s.endswith(".py") or not os.path.isabs(s) or _library_path(s):
        return False
    if not os.path.isfile(s):
        return False  # built-in and synthetic modules (torch._classes says "_classes.py")
    real = os.path.realpath(s)
    return real.endswith(".py") and not _library_path(real)


def user_file(module: object) -> Path | None:
    """The resolved source file of ``module`` when it is a user module, else None."""
    try:
        f = getattr(module, "__file__", None) if isinstance(module, ModuleType) else None
    except Exception:  # a lazy module's __getattr__: not the user's code
        return None
    return Path(f).resolve() if isinstance(f, str) and is_user_file(f) else None


def project_modules(roots: Iterable[Path]) -> dict[str, ModuleType]:
    """The modules in ``sys.modules`` whose user file lies under one of ``roots`` (the project's own code)."""
    real = [r.resolve() for r in roots]
    found = {}
    for name, module in list(sys.modules.items()):
        if name in _RUNNING:
            continue
        f = user_file(module)
        if f is not None and any(f.is_relative_to(r) for r in real):
            found[name] = module
    return found


def _imported_names(package: str, file: Path) -> Iterator[str]:
    """Module names the import statements in ``file`` name (relative ones resolved against ``package``),
    and ``pkg.attr`` for every ``from pkg import attr`` (attr may be a submodule)."""
    try:
        tree = ast.parse(file.read_text(encoding="utf-8", errors="replace"), filename=str(file))
    except (OSError, SyntaxError, ValueError):  # the file changed since it was imported: globals still count
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                yield from (".".join(parts[: i + 1]) for i in range(len(parts)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".") if package else []
                if node.level - 1 > len(anchor):
                    continue
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if not base:
                continue
            yield base
            yield from (f"{base}.{a.name}" for a in node.names if a.name != "*")


def _referenced(module: ModuleType) -> Iterator[object]:
    """Modules reachable in one step through ``module``'s globals: module objects, and the modules that
    defined its functions and classes."""
    own_prefix = f"{module.__name__}." if hasattr(module, "__path__") else None
    for value in list(vars(module).values()):
        if isinstance(value, ModuleType):
            if own_prefix is None or not value.__name__.startswith(own_prefix):
                yield value  # a package's submodules are its attributes once anything imports them: not its code
            continue
        try:
            owner = getattr(value, "__module__", None)
        except Exception:  # an object whose attribute access runs code: skip it
            continue
        if isinstance(owner, str):
            yield sys.modules.get(owner)


def user_dependencies(
    module: ModuleType, fresh: Iterable[ModuleType] = (), roots: Iterable[Path] = ()
) -> dict[Path, ModuleType | None]:
    """The user files ``module`` depends on, each with the module that came from it: its own first, then
    every user module it reaches (sorted by path).

    Args:
        module: the loaded module.
        fresh: modules the load imported afresh (counted even when nothing references them: an import
            for its side effect, such as registering a layer).
        roots: the project's folders (``model.python_path``): an import statement naming a module that is
            not imported yet (``from .layers import Net`` inside the factory, run later) is found there by
            file, without importing it, and mapped to None.
    """
    roots = list(roots)
    found: dict[Path, ModuleType | None] = {}
    todo: list[ModuleType | tuple[str, Path]] = [module, *fresh]
    visited: set[object] = set()
    while todo:
        item = todo.pop(0)  # breadth first: a file is attributed to the module nearest the loaded one
        if isinstance(item, ModuleType):
            if id(item) in visited:
                continue
            visited.add(id(item))
            f = user_file(item)
            if f is None and item is not module:
                continue  # the walk follows user modules only: never into torch, numpy, ...
            refs = list(_referenced(item))
            package = getattr(item, "__package__", None) or ""
        else:  # a project file nothing has imported yet: its import statements only
            name, f = item
            if f in visited or f in found:
                continue
            refs = []
            package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        if f is None:
            names: list[str] = []
        else:
            visited.add(f)
            found.setdefault(f, item if isinstance(item, ModuleType) else None)
            names = list(_imported_names(package, f))
        for ref in refs + [sys.modules.get(n) for n in names]:
            if isinstance(ref, ModuleType) and id(ref) not in visited and user_file(ref) is not None:
                todo.append(ref)
        for n in names:
            if n not in sys.modules and roots:
                file = module_file_in_roots(n, roots)
                if file is not None and file not in visited:
                    todo.append((n, file))
    own = user_file(module)
    order = ([own] if own in found else []) + sorted(f for f in found if f != own)
    return {f: found[f] for f in order}


# file -> (the module's spec when first seen already imported, the file's sha256 then)
_SEEN: dict[Path, tuple[object, str]] = {}


def changed_since_import(file: Path, module: ModuleType) -> bool:
    """True when ``file`` changed on disk since this process first saw ``module`` already imported.

    The first sight records the file's hash. ``importlib.reload`` gives a module a new spec, which starts
    over (the reloaded code is the file's code). An edit made before the first sight goes unnoticed.
    """
    spec = getattr(module, "__spec__", None)
    sha = sha256_file(file)
    seen = _SEEN.get(file)
    if seen is not None and seen[0] is spec:
        return seen[1] != sha
    _SEEN[file] = (spec, sha)
    return False
