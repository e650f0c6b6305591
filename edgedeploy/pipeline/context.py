"""What a running build knows: config, target, staging folder, inputs, lazily loaded model."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgedeploy.config import DeployConfig
from edgedeploy.errors import ConfigError, InputError
from edgedeploy.pipeline.hashing import sha256_file
from edgedeploy.targets import TargetProfile


@dataclass
class BuildContext:
    """Shared state of one build. Stages read inputs and write files through it."""

    cfg: DeployConfig
    target: TargetProfile
    staging: Path
    out: Path
    external: dict[str, Path] = field(default_factory=dict)  # name -> file outside staging
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage name -> metrics
    warnings: list[str] = field(default_factory=list)
    log: Any = None  # callable(str) for progress lines
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
        p = self.path(name)
        if name in self.external and name in self._sha:
            return self._sha[name]
        if not p.is_file():
            raise InputError(f"{name}: file not found: {p}")
        sha = sha256_file(p)
        if name in self.external:
            self._sha[name] = sha
        return sha

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
            from edgedeploy.stages.checkpoint import load_model

            # a Hugging Face folder's weights are loaded by its factory (from_pretrained), not as a state dict
            checkpoint = None if self.cfg.model.hf else self.external.get("checkpoint")
            self._model = load_model(self.cfg, checkpoint)
        return self._model


def factory_source(cfg: DeployConfig) -> Path | None:
    """The source file of the model factory's module, without importing it (for cache keys).

    Raises:
        ConfigError: the module cannot be found on the configured python path.
    """
    module_name = cfg.model.factory.partition(":")[0]
    for p in reversed(cfg.model.python_path):
        resolved = str(cfg.path(p))
        if resolved not in sys.path:
            sys.path.insert(0, resolved)
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as exc:
        raise ConfigError(
            f"{cfg.source}: key 'model.factory': cannot find module {module_name!r} ({exc})",
            hint="check the module name and model.python_path",
        ) from None
    if spec is None:
        raise ConfigError(
            f"{cfg.source}: key 'model.factory': cannot find module {module_name!r}",
            hint="check the module name and model.python_path",
        ) from None
    if spec.origin and spec.origin not in ("built-in", "frozen") and Path(spec.origin).is_file():
        return Path(spec.origin)
    return None
