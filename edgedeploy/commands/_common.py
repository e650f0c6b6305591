"""Helpers shared by subcommands: config flags generated from the config schema."""

from __future__ import annotations

import argparse
from typing import Any

from edgedeploy.config import DeployConfig, config_from_dict, flag_fields, load_config, parse_flag_value
from edgedeploy.errors import ConfigError


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """``--config`` plus one flag per config field that declares one (see config.py)."""
    parser.add_argument("--config", "-c", help="path to deploy.toml (optional with --hf)")
    group = parser.add_argument_group("config overrides (each sets one config field)")
    for ff in flag_fields():
        group.add_argument(
            ff.flag,
            dest=f"cfg:{ff.dotted}",
            metavar=ff.dotted.split(".")[-1].upper(),
            default=None,
            help=f"{ff.help} [{ff.dotted}]",
        )


def config_from_args(args: argparse.Namespace) -> DeployConfig:
    """Load ``--config`` with every given override flag applied.

    Raises:
        ConfigError: bad file, bad flag value, or validation failure naming the key.
    """
    fields = {ff.dotted: ff for ff in flag_fields()}
    overrides: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if dest.startswith("cfg:") and value is not None:
            dotted = dest[4:]
            overrides[dotted] = parse_flag_value(fields[dotted], value)
    if args.config is None:
        if "model.hf" not in overrides:
            raise ConfigError(
                "no config: pass --config PATH to a deploy.toml", hint="or --hf FOLDER for a Hugging Face model"
            )
        from pathlib import Path

        # a Hugging Face folder brings inputs, outputs and factory: flags alone make a config
        return config_from_dict({}, source="<flags>", base_dir=Path.cwd(), overrides=overrides)
    return load_config(args.config, overrides)
