"""Python API beside the CLI: build from a config (object or file) and get a result back."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgedeploy.config import INTERNAL_FIELDS, DeployConfig, config_from_dict
from edgedeploy.config import load_config as _load_config
from edgedeploy.config_flags import check_override_keys
from edgedeploy.pipeline.runner import BuildResult, run_build


def load_config(path: str | Path, **overrides: Any) -> DeployConfig:
    """Load and validate a ``deploy.toml``; keyword overrides use dotted keys with ``__``.

    Example: ``load_config("deploy.toml", build__target="cpu")``.

    Raises:
        ConfigError: the file or an override is invalid; an unknown keyword names the closest one.
    """
    return _load_config(path, _dotted(overrides))


def _dotted(overrides: dict[str, Any]) -> dict[str, Any]:
    """Keyword overrides (``build__target``) as dotted config keys, each checked against the schema first.

    A relative path given to a path field (``build__out="build/r18"``) is taken from the working directory, as
    the same path given to its command-line flag is: it is the caller's path, not the config file's.

    Raises:
        ConfigError: a keyword that names no config key (``target``), with the keyword it most likely meant
            (``build__target``): the keyword is at fault, not the config file.
    """
    from edgedeploy.config_flags import flag_fields

    dotted = {k.replace("__", "."): v for k, v in overrides.items()}
    check_override_keys(list(dotted), spell=lambda key: key.replace(".", "__"), what="keyword")
    paths = {ff.dotted for ff in flag_fields() if ff.path}
    return {
        key: str(Path(value).expanduser().resolve()) if key in paths and isinstance(value, (str, Path)) else value
        for key, value in dotted.items()
    }


def build(
    config: DeployConfig | str | Path | dict[str, Any], *, log: Callable[[str], None] | None = None, **overrides: Any
) -> BuildResult:
    """Run ``deploy build`` from Python.

    Args:
        config: a :class:`DeployConfig`, a path to a TOML file, or a plain dict.
        log: progress callback (default: print to stderr).
        overrides: dotted config keys with ``__``, e.g. ``build__out="out"``.

    Raises:
        DeployError: any subclass, as the CLI would report it.
    """
    if isinstance(config, (str, Path)):
        cfg = load_config(config, **overrides)
    elif isinstance(config, dict):
        cfg = config_from_dict(config, overrides=_dotted(overrides))
    else:
        cfg = config
        if overrides:
            raw = {k: v for k, v in cfg.to_dict().items() if k not in INTERNAL_FIELDS}
            given = cfg
            cfg = config_from_dict(
                raw,
                source=cfg.source,
                base_dir=cfg.base_dir,
                overrides=_dotted(overrides),
            )
            kept = {  # exported samples the overrides left in place keep their origin
                key: origin
                for key, origin in given.data_origins.items()
                if _value(cfg, key) == _value(given, key) and key not in cfg.data_origins
            }
            same_factory = cfg.model.factory == given.model.factory  # a sidecar's factory stays a sidecar's
            cfg = dataclasses.replace(
                cfg,
                factory_origin=given.factory_origin if same_factory else cfg.factory_origin,
                data_origins={**cfg.data_origins, **kept},
            )
    return run_build(cfg, log=log)


def _value(cfg: DeployConfig, dotted: str) -> Any:
    section, _, name = dotted.partition(".")
    return getattr(getattr(cfg, section), name)
