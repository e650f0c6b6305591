"""Which files the model's code is, remembered between builds, so a build whose stages are all cached never
imports the user's module (and, through it, PyTorch).

The model code's files key every stage's cache entry (``model_code`` in the manifest). Finding them means
importing the factory's module, and a PyTorch model's module imports torch: seconds before the first cache
lookup. After each build that imported it, the file list is written to the stage cache with the
sha256 of every listed file and a digest of every ``.py`` file under ``model.python_path``. A later build
uses the list only when every listed file still has its sha256 and the digest of the project's Python files
is unchanged (so a new module that would shadow an import, or an edit anywhere in the project, makes the
build import the module again). The memo is one of the stage cache's HMAC-authenticated memos, so a list
someone else wrote into the cache folder is never used. The factory is then imported only if a stage has to run
(:func:`factory_loader`), and the files that import reads must be the remembered ones.

Nothing from the memo is executed; it only names files, and each is checked against its sha256 on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from edgedeploy.artifacts import MODEL_CODE
from edgedeploy.config import DeployConfig
from edgedeploy.errors import ConfigError
from edgedeploy.fileio.hashing import sha256_file, sha256_json

MEMO_DIR = "code"
MEMO_SCHEMA = "edgedeploy-code-memo/1"
MAX_TREE_FILES = 2000  # a project folder with more Python files than this is not digested: the module is imported
_SKIP_DIRS = {"__pycache__", "site-packages", "node_modules", "build", "dist"}


def _roots(cfg: DeployConfig) -> list[Path]:
    return [r.resolve() for r in (cfg.path(p) for p in cfg.model.python_path) if r is not None]


def tree_digest(roots: list[Path]) -> str | None:
    """sha256 over the path and contents of every ``.py`` file under ``roots`` (hidden and build folders
    skipped); None when there are more than :data:`MAX_TREE_FILES`."""
    entries: list[tuple[str, str]] = []
    for root in roots:
        if root.is_file():
            entries.append((str(root), sha256_file(root)))
            continue
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
            for name in sorted(files):
                if name.endswith(".py"):
                    path = Path(folder) / name
                    entries.append((str(path), sha256_file(path)))
                    if len(entries) > MAX_TREE_FILES:
                        return None
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def memo_key(cfg: DeployConfig) -> str:
    """What the file list depends on besides the files: the factory, the roots, the interpreter, and where imports
    resolve (``sys.path``, so ``PYTHONPATH``: another folder there can hold another module of the same name)."""
    return sha256_json(
        {
            "schema": MEMO_SCHEMA,
            "factory": cfg.model.factory,
            "origin": getattr(cfg, "factory_origin", "config"),
            "roots": [str(r) for r in _roots(cfg)],
            "python": list(sys.version_info[:2]),
            "executable": sys.executable,
            "path": list(sys.path),
        }
    )


def _user_modules_loaded() -> bool:
    """Whether this process already holds user modules (a notebook, a test run): their files join the model's
    code in ways the memo cannot see, so the module is imported as usual."""
    from edgedeploy.modelio.userfiles import is_user_file

    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and name not in ("__main__", "__mp_main__") and is_user_file(file):
            return True
    return False


class MemoStore(Protocol):
    """Where memos are kept: the stage cache's authenticated text memos (``pipeline.cache``), so a memo someone
    else wrote into the cache folder is never trusted."""

    def read_memo(self, name: str) -> str | None: ...

    def write_memo(self, name: str, text: str) -> None: ...


@dataclass(frozen=True)
class CodeMemo:
    """Reads and writes the remembered file list of one build's model code."""

    store: MemoStore  # the stage cache
    key: str
    roots: tuple[Path, ...]

    @classmethod
    def for_build(cls, cfg: DeployConfig, store: MemoStore) -> CodeMemo | None:
        """The memo for ``cfg``, or None when the build cannot use one (cache off, user modules loaded)."""
        if not cfg.build.cache or _user_modules_loaded():
            return None
        return cls(store, memo_key(cfg), tuple(_roots(cfg)))

    @property
    def name(self) -> str:
        return f"{MEMO_DIR}-{self.key}"

    def recall(self) -> tuple[Path, ...] | None:
        """The remembered files when every check passes, else None (an absent or unauthenticated memo is ignored)."""
        text = self.store.read_memo(self.name)
        if text is None:
            return None
        try:
            data = json.loads(text)
            if data.get("schema") != MEMO_SCHEMA or data.get("tree") is None:
                return None
            files = [(Path(f["path"]), str(f["sha256"])) for f in data["files"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        for path, sha in files:
            if not path.is_file() or sha256_file(path) != sha:
                return None
        if tree_digest(list(self.roots)) != data["tree"]:
            return None
        return tuple(p for p, _ in files)

    def remember(self, files: tuple[Path, ...]) -> None:
        """Write the list (best effort: a read-only cache only costs the next build its import)."""
        tree = tree_digest(list(self.roots))
        if tree is None:
            return
        data = {
            "schema": MEMO_SCHEMA,
            "tree": tree,
            "files": [{"path": str(f), "sha256": sha256_file(f)} for f in files],
        }
        try:
            self.store.write_memo(self.name, json.dumps(data))
        except OSError:
            pass


def factory_loader(cfg: DeployConfig, files: tuple[Path, ...], memo: CodeMemo) -> Callable[[], Any]:
    """A loader of the model factory for the first stage that needs the model (none, when every stage is
    cached): it imports the module and checks the files it read are the remembered ones the cache keys hold.
    """

    def load() -> Any:
        """Raises:
        ConfigError: the module does not import, or imported other files than the remembered ones.
        """
        from edgedeploy.modelio import usercode

        loaded = usercode.load_factory(cfg)
        if tuple(loaded.files) != files:
            memo.remember(tuple(loaded.files))
            raise ConfigError(
                f"the model code's files changed during the build ({len(files)} remembered, "
                f"{len(loaded.files)} imported)",
                hint="run the build again (it reads the files as they are now)",
            )
        return loaded.factory

    return load


READS_SCHEMA = "edgedeploy-reads-memo/1"


@dataclass(frozen=True)
class ReadsMemo:
    """The files and folders one group of user code (the model factory, the calibration callable) read when it
    last ran (:mod:`edgedeploy.modelio.reads`), remembered so the next build keys them before the code runs.

    Only a path list: each path's content is hashed when the key is computed. A lost memo costs one build whose
    stages are not stored (the runner stores no entry whose key missed a file the code read), never a stale one.
    """

    store: MemoStore
    key: str

    @classmethod
    def for_group(cls, cfg: DeployConfig, store: MemoStore, group: str, spec: str) -> ReadsMemo:
        key = sha256_json(
            {
                "schema": READS_SCHEMA,
                "group": group,
                "spec": spec,
                "kwargs": cfg.model.kwargs if group == MODEL_CODE else None,  # they may choose the files read
                "base": str(cfg.base_dir),
                "roots": [str(r) for r in _roots(cfg)],
            }
        )
        return cls(store, key)

    @property
    def name(self) -> str:
        return f"reads-{self.key}"

    def recall(self) -> tuple[Path, ...]:
        """The remembered paths (none when absent or not authenticated)."""
        text = self.store.read_memo(self.name)
        try:
            data = json.loads(text) if text is not None else {}
            if data.get("schema") != READS_SCHEMA:
                return ()
            return tuple(Path(p) for p in data["paths"] if isinstance(p, str) and os.path.isabs(p))
        except (ValueError, KeyError, TypeError, AttributeError):
            return ()

    def remember(self, paths: list[Path]) -> None:
        """Write the list (best effort: a read-only cache only costs the next build its cache entries)."""
        try:
            self.store.write_memo(self.name, json.dumps({"schema": READS_SCHEMA, "paths": [str(p) for p in paths]}))
        except OSError:
            pass
