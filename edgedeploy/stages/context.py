"""What a running build knows: config, target, staging folder, external inputs, lazily loaded model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgedeploy.config import DeployConfig
from edgedeploy.errors import InputError
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
    # name -> several files hashed as one input (the user's model code: every module it imported)
    groups: dict[str, tuple[Path, ...]] = field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage name -> metrics
    warnings: list[str] = field(default_factory=list)
    log: Any = None  # callable(str) for progress lines
    factory: Any = None  # the model factory, when the runner already loaded it
    _model: Any = None
    _sha: dict[str, str] = field(default_factory=dict)

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
                self._sha[name] = sha256_json({str(f): self._file_sha(f, name) for f in self.groups[name]})
            return self._sha[name]
        p = self.path(name)
        if name in self.external and name in self._sha:
            return self._sha[name]
        if not p.is_file():
            raise InputError(f"{name}: file not found: {p}")
        sha = sha256_file(p)
        if name in self.external:
            self._sha[name] = sha
        return sha

    @staticmethod
    def _file_sha(path: Path, name: str) -> str:
        if not path.is_file():
            raise InputError(f"{name}: file not found: {path}")
        return sha256_file(path)

    def has_input(self, name: str) -> bool:
        """True when external input ``name`` is configured for this build."""
        return name in self.external or name in self.groups

    def warn(self, message: str) -> None:
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
            model = load_model(self.cfg, checkpoint, self.factory)
            dry_forward(model, self.cfg)  # the input spec fits forward(), before any stage traces or runs it
            self._model = model
        return self._model
