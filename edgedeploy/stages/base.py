"""The contract every pipeline stage follows: the build context it reads, the result it returns, the Stage base."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from edgedeploy.artifacts import CHECKPOINT, MODEL_CODE
from edgedeploy.config import DeployConfig
from edgedeploy.errors import DeployError, InputError
from edgedeploy.fileio.digest_memo import identity
from edgedeploy.fileio.hashing import sha256_file, sha256_json
from edgedeploy.targets import TargetProfile


@dataclass
class BuildContext:
    """Shared state of one build. Stages read inputs and write files through it."""

    cfg: DeployConfig
    target: TargetProfile
    staging: Path
    out: Path
    external: dict[str, Path] = field(default_factory=dict)  # name -> file outside staging
    # name -> several files hashed as one input (the user's model or calibration code: every module it imported)
    groups: dict[str, tuple[Path, ...]] = field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage name -> metrics
    warnings: list[str] = field(default_factory=list)
    log: Any = None  # callable(str) for progress lines
    on_status: Any = None  # callable(str): the live status of the running stage (a terminal's live line)
    factory: Any = None  # the model factory, when the runner already loaded it
    factory_loader: Any = None  # callable() -> factory, for the first stage that needs the model (cached builds)
    # eager PyTorch outputs at the shape probes (feeds, outputs), from the first stage that ran them this build
    probe_outputs: Any = None
    _model: Any = None
    # a fileio.digest_memo.DigestMemo: external inputs unchanged since an earlier build keep their digest
    digests: Any = None
    _sha: dict[str, str] = field(default_factory=dict)
    # staging file name -> (the file's stat signature when hashed, sha256): every stage that reads a 90 MB model
    # would otherwise hash it again; the runner forgets a stage's files when the stage writes or restores them
    _staged_sha: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    # an input group's file -> its sha256, hashed once per build (the group's digest and the manifest both list it)
    _group_file_sha: dict[Path, str] = field(default_factory=dict)
    # input group -> the paths its code read when it last ran (modelio.reads): hashed into the group's digest
    reads: dict[str, tuple[Path, ...]] = field(default_factory=dict)
    read_log: Any = None  # the modelio.reads.ReadLog of this build: what user code read while it ran
    _keyed: set[str] | None = None  # real paths the keys hold (unkeyed_reads), gathered once

    @property
    def precision(self) -> str:
        return self.cfg.precision.mode

    def path(self, name: str) -> Path:
        """Where artifact ``name`` lives: the staging folder, or an external input."""
        if name in self.external:
            return self.external[name]
        return self.staging / name

    def sha256(self, name: str) -> str:
        """sha256 of artifact ``name`` (external inputs hashed once per build).

        Raises:
            InputError: the artifact does not exist.
        """
        if name in self.groups:
            if name not in self._sha:
                files = {str(f): self.group_file_sha(name, f) for f in self.groups[name]}
                read = self.read_states(name)
                self._sha[name] = sha256_json({"files": files, "reads": read} if read else files)
            return self._sha[name]
        p = self.path(name)
        if name in self.external and name in self._sha:
            return self._sha[name]
        if not p.is_file():
            raise InputError(f"{name}: file not found: {p}")
        if name in self.external:
            self._sha[name] = self.digests.sha256(p) if self.digests is not None else sha256_file(p)
            return self._sha[name]
        signature = _signature(p)
        known = self._staged_sha.get(name)
        if known is not None and known[0] == signature:
            return known[1]
        sha = sha256_file(p)
        if _signature(p) == signature:  # unchanged while it was read: the digest is this version's
            self._staged_sha[name] = (signature, sha)
        return sha

    def forget_digests(self, names: list[str] | tuple[str, ...]) -> None:
        """Drop the remembered sha256 of staging files ``names`` (a stage just wrote or restored them)."""
        for name in names:
            self._staged_sha.pop(name, None)

    def remember_digest(self, name: str, sha: str) -> None:
        """Record ``sha`` as staging file ``name``'s sha256: the caller has just checked that it is (a cache restore
        verifies every copy it makes)."""
        self._staged_sha[name] = (_signature(self.staging / name), sha)

    def group_file_sha(self, name: str, path: Path) -> str:
        """sha256 of ``path``, a file of input group ``name``, hashed once per build.

        Raises:
            InputError: the file does not exist.
        """
        if path not in self._group_file_sha:
            if not path.is_file():
                raise InputError(f"{name}: file not found: {path}")
            self._group_file_sha[path] = self.digests.sha256(path) if self.digests is not None else sha256_file(path)
        return self._group_file_sha[path]

    def read_state(self, path: Path) -> str:
        """What a path user code read holds (:func:`edgedeploy.modelio.reads.path_state`); a file's sha256 through
        the digest memo when there is one (the key and the manifest both ask: a large weights file is hashed once)."""
        from edgedeploy.modelio.reads import path_state

        if self.digests is not None and path.is_file():
            return "file:" + self.digests.sha256(path)
        return path_state(path)

    def read_states(self, name: str) -> dict[str, str]:
        """Path -> :meth:`read_state`, for the paths input group ``name``'s code read when it last ran (``reads``)."""
        return {str(path): self.read_state(path) for path in self.reads.get(name, ())}

    def unkeyed_reads(self) -> list[Path]:
        """Paths user code read in this build that no cache key of it holds: not an input file, not in an input
        group, not remembered from the code's last run (the first build of code that reads files)."""
        if self.read_log is None or not self.read_log.paths:
            return []
        if self._keyed is None:  # the inputs, groups and remembered reads are fixed for the build
            keyed = {os.path.realpath(p) for p in self.external.values()}
            for name, files in self.groups.items():
                keyed.update(os.path.realpath(f) for f in (*files, *self.reads.get(name, ())))
            self._keyed = keyed
        read = [p for name in self.read_log.paths for p in self.read_log.of(name)]
        return [p for p in read if os.path.realpath(p) not in self._keyed]

    def has_input(self, name: str) -> bool:
        """True when external input ``name`` is configured for this build."""
        return name in self.external or name in self.groups

    def status(self, text: str, *, tick: bool = False) -> None:
        """What a long step of the running stage is doing now (``INT8 search: try 3 of 13 ...``): the live line
        on a terminal, a plain line in logs (through ``log`` when no live display is attached). A ``tick``
        (``batch 7 of 64``) only updates the live line; plain logs show one now and then."""
        if self.on_status is not None:
            self.on_status(text, tick=tick)
        elif self.log and not tick:
            self.log(f"  {text}")

    def warn(self, message: str) -> None:
        """Add a build warning and show it. The runner's own warnings; stages return theirs in their
        :class:`StageResult` (a stage calling this is folded into its result, for compatibility).
        """
        self.warnings.append(message)
        if self.log:
            self.log(f"  warning: {message}")

    def model(self) -> Any:
        """The PyTorch model with checkpoint weights loaded, in eval mode (loaded once, on demand).

        Raises:
            ConfigError: the factory does not import or fails.
            CheckpointError: the checkpoint is unreadable or does not fit the model.
        """
        if self._model is None:
            from edgedeploy.modelio.admission import dry_forward
            from edgedeploy.modelio.checkpoint import load_model

            # a Hugging Face folder's weights are loaded by its factory (from_pretrained), not as a state dict
            checkpoint = None if self.cfg.model.hf else self.external.get("checkpoint")
            if self.factory is None and self.factory_loader is not None:
                self.factory = self.factory_loader()
            model = load_model(self.cfg, checkpoint, self.factory)
            dry_forward(model, self.cfg)  # the input spec fits forward(), before any stage traces or runs it
            self._model = model
        return self._model


@dataclass
class StageResult:
    """What a stage returns, cached as a whole: JSON-able metrics, warnings for the user, notes for the report.

    A stage that fails after measuring something attaches its partial result to the error
    (``DeployError.partial``) instead of writing into the context.
    """

    metrics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "warnings": list(self.warnings), "notes": list(self.notes)}

    @classmethod
    def of(cls, value: Any) -> StageResult:
        """A result from what ``run`` returned (a StageResult, a metrics dict, or None)."""
        if isinstance(value, StageResult):
            return value
        return cls(metrics=dict(value or {}))


@contextmanager
def partial_result(result: StageResult) -> Iterator[StageResult]:
    """Within the block, a :class:`DeployError` leaves carrying ``result`` (the warnings gathered so far)
    as its partial result, so they reach the failure report; an error that already carries a partial
    result keeps it, with these warnings first.
    """
    try:
        yield result
    except DeployError as exc:
        if exc.partial is None:
            exc.partial = result
        else:
            own = StageResult.of(exc.partial)
            own.warnings = result.warnings + [w for w in own.warnings if w not in result.warnings]
            exc.partial = own
        raise


class Stage(ABC):
    """One step of the pipeline, named by what it makes from what (``OnnxFromTorch``).

    A stage declares the staging files it consumes (written by earlier stages: ``consumes``,
    or :meth:`requires` when that depends on the build; each must exist when the stage runs,
    else the runner raises :class:`~edgedeploy.errors.StageInputError`), the staging files it
    reads only when present (``optional``, declared explicitly), the external inputs it
    depends on (:meth:`inputs`: checkpoint, user code, calibration or validation data; a
    declared input the build lacks is an error) and the files it produces. Its cache key
    hashes ``name``, ``version``, :meth:`config_key`, the consumed files, the inputs and the Python
    environment (:func:`edgedeploy.fileio.environment.environment_key`); when the key is unchanged the
    stage is not run and its files and whole :class:`StageResult` (warnings included) come from the cache.
    Stages never import each other: shared code lives in the tool and domain packages, shared names in
    ``edgedeploy.artifacts``.
    """

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    cacheable: ClassVar[bool] = True  # False: always run (a verdict on this build, like the gate)
    consumes: ClassVar[tuple[str, ...]] = ()  # staging files it reads; each must exist when it runs
    optional: ClassVar[tuple[str, ...]] = ()  # staging files it reads only when an earlier stage wrote them
    produces: ClassVar[tuple[str, ...]] = ()

    def applies(self, ctx: BuildContext) -> str | None:
        """None when the stage runs for this build, else the reason it is skipped."""
        return None

    def outputs(self, ctx: BuildContext) -> tuple[str, ...]:
        """Files this stage writes for this build (default: ``produces``)."""
        return self.produces

    def requires(self, ctx: BuildContext) -> tuple[str, ...]:
        """Staging files this stage needs for this build (default: ``consumes``); each is hashed into
        the cache key, and one that is missing when the stage is about to run is an error.
        """
        return self.consumes

    def inputs(self, ctx: BuildContext) -> tuple[str, ...]:
        """External inputs (``artifacts.CHECKPOINT``, ``MODEL_CODE``, ``CALIBRATION``, ``CALIB_CODE``,
        ``VALIDATION_DATA``) this stage's result depends on for this build; each is hashed into
        the cache key, and one the build does not have is an error. Default: none.
        """
        return ()

    def config_key(self, ctx: BuildContext) -> Any:
        """The config fields (and target facts) this stage's result depends on."""
        return None

    @abstractmethod
    def run(self, ctx: BuildContext) -> StageResult | dict[str, Any]:
        """Do the work: write ``outputs`` into ``ctx.staging``; return a :class:`StageResult`
        (a plain metrics dict is accepted) whose warnings and notes are part of the cached result, so
        they survive a cache hit. Stages return warnings; they never write ``ctx.warnings`` or
        ``ctx.metrics`` (``ctx.warn`` during a run is folded into the result for third-party stages).

        Raises:
            DeployError: a subclass naming what failed and how to fix it.
        """


def model_inputs(ctx: BuildContext) -> tuple[str, ...]:
    """The inputs of anything computed from the PyTorch model: its code and, when configured, its weights."""
    return ((CHECKPOINT,) if CHECKPOINT in ctx.external else ()) + (MODEL_CODE,)


def _signature(path: Path) -> tuple[int, ...]:
    """What changes when a file is written: inode, size, modification and status-change times (ns)."""
    return identity(path.stat())
