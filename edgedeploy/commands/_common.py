"""Helpers shared by subcommands: config flags generated from the config schema, and the config they make.

Every config section field has a flag (``edgedeploy.config_flags``); booleans are switches with a ``--no-``
form. Without ``--config`` the flags alone describe the model: ``--factory MODULE:FN --input NAME:SHAPE``,
``--onnx MODEL.onnx``, ``--hf FOLDER``, or ``--checkpoint`` naming a checkpoint (or a trainer's folder) whose
``.meta.json`` sidecar describes it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from edgedeploy.config import DeployConfig, config_from_dict, load_config
from edgedeploy.config_flags import FlagField, flag_fields, model_overrides, parse_flag_value, parse_set
from edgedeploy.errors import ConfigError
from edgedeploy.sidecar import has_sidecar

QUICK_SOURCES = ("model.factory", "model.onnx", "model.hf")


class SwitchAction(argparse.BooleanOptionalAction):
    """``--simplify`` / ``--no-simplify``; the positive form also takes an explicit value
    (``--simplify false``, ``--equalize auto``) so configs written for value flags keep working."""

    def __init__(self, option_strings: list[str], dest: str, words: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.nargs = "?"
        self.words = words
        self.metavar = "|".join(words) if words else "true|false"

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        if option_string is None or option_string not in self.option_strings:
            return
        negative = option_string.startswith("--no-")
        if values is not None:
            if negative:
                parser.error(f"{option_string} takes no value (got {values!r})")
            setattr(namespace, self.dest, values)  # read (and checked) with the other flags
            return
        setattr(namespace, self.dest, not negative)

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


class FlagHelpFormatter(argparse.HelpFormatter):
    """Shows a switch as ``--simplify, --no-simplify`` (``--equalize [auto], --no-equalize``) in ``--help``."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, SwitchAction):
            first = action.option_strings[0] + (f" [{'|'.join(action.words)}]" if action.words else "")
            return ", ".join([first, *action.option_strings[1:]])
        return super()._format_action_invocation(action)


def _add_field_flag(group: Any, ff: FlagField) -> None:
    dest = f"cfg:{ff.dotted}"
    help_text = f"{ff.help} [{ff.dotted}]"
    if ff.kind in ("bool", "bool-auto"):
        # the --no- form is added by BooleanOptionalAction
        group.add_argument(ff.flag, dest=dest, action=SwitchAction, words=ff.choices, default=None, help=help_text)
        return
    metavar = {"ints": "N,N", "floats": "X,X", "strs": "A,B", "json": "JSON"}.get(
        ff.kind, ff.dotted.split(".")[-1].upper()
    )
    if ff.kind == "choice":
        metavar = "{" + ",".join(ff.choices) + "}"
    group.add_argument(ff.flag, dest=dest, metavar=metavar, default=None, help=help_text)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """``--config``, the model-description flags, ``--set`` and one flag per config field."""
    parser.add_argument("--config", "-c", help="path to deploy.toml (optional with --factory, --onnx or --hf)")
    model = parser.add_argument_group("the model without a config file (each replaces the config's own)")
    model.add_argument(
        "--input",
        action="append",
        metavar="NAME:SHAPE[:DTYPE]",
        help="one model input, e.g. image:1x3x224x224 or image:batchx3x224x224 (repeat per input)",
    )
    model.add_argument(
        "--dim",
        action="append",
        metavar="NAME=MIN:OPT:MAX",
        help="sizes of a named dynamic dim, e.g. batch=1:4:8 (repeat per dim)",
    )
    model.add_argument("--output", action="append", metavar="NAME",
                       help="one model output name, in order (repeat per output; default: output)")  # fmt: skip
    model.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="any other config key, value as TOML, e.g. --set tolerance.int8.min_cosine=0.97",
    )
    group = parser.add_argument_group("config overrides (each sets one config field)")
    for ff in flag_fields():
        _add_field_flag(group, ff)


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Dotted key -> value for every config flag given on the command line.

    Raises:
        ConfigError: a flag value that does not parse, a ``--set`` key that is not in the schema, or a key given
            both by its own flag and by ``--set`` (which one was meant cannot be known).
    """
    fields = {ff.dotted: ff for ff in flag_fields()}
    overrides: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if dest.startswith("cfg:") and value is not None:
            dotted = dest[4:]
            overrides[dotted] = parse_flag_value(fields[dotted], value)
    flagged = dict(overrides)
    for text in getattr(args, "set", None) or []:
        key, value = parse_set(text)
        if key in flagged and flagged[key] != value:
            raise ConfigError(
                f"{key} is given twice: {fields[key].flag} {flagged[key]!r} and --set {key}={value!r}",
                hint=f"give one of them ({fields[key].flag} is the usual one)",
            )
        overrides[key] = value
    overrides.update(
        model_overrides(getattr(args, "input", None), getattr(args, "dim", None), getattr(args, "output", None))
    )
    return overrides


def config_from_args(args: argparse.Namespace) -> DeployConfig:
    """Load ``--config`` with every given override flag applied, or make the config from flags alone.

    Raises:
        ConfigError: bad file, bad flag value, or validation failure naming the key.
    """
    overrides = config_overrides(args)
    try:
        return _config_from_overrides(args, overrides)
    except ConfigError as exc:
        raise _named_by_flag(exc, args) from None


def _named_by_flag(exc: ConfigError, args: argparse.Namespace) -> ConfigError:
    """``exc`` naming the flag the user typed where it blames a key a dedicated flag set (``as overridden by
    --samples (validate.samples)``), not only the key; ``exc`` itself otherwise (a ``--set`` key is its own)."""
    flags = {ff.dotted: ff.flag for ff in flag_fields() if getattr(args, f"cfg:{ff.dotted}", None) is not None}
    for dotted, flag in flags.items():
        blamed = f", as overridden by {dotted}: "
        if blamed in exc.message:
            return ConfigError(exc.message.replace(blamed, f", as overridden by {flag} ({dotted}): ", 1), hint=exc.hint)
    return exc


def _config_from_overrides(args: argparse.Namespace, overrides: dict[str, Any]) -> DeployConfig:
    if args.config is not None:
        return load_config(args.config, overrides)
    given = [k for k in QUICK_SOURCES if overrides.get(k)]
    # a checkpoint (or the folder a trainer wrote) whose .meta.json sidecar describes the model
    described = has_sidecar(overrides.get("model.checkpoint"))
    if not given and not described:
        if overrides.get("model.checkpoint"):
            raise ConfigError(
                f"--checkpoint {overrides['model.checkpoint']} has no .meta.json sidecar describing the model",
                hint="add --factory MODULE:FN --input NAME:SHAPE, or write the checkpoint with "
                "edgedeploy.train.export_for_deploy (or deploy train)",
            )
        raise ConfigError(
            "no config: pass --config PATH to a deploy.toml",
            hint="or describe the model with flags: --factory MODULE:FN --input NAME:SHAPE, --onnx MODEL.onnx, "
            "--hf FOLDER, or --checkpoint FOLDER written by export_for_deploy / deploy train",
        )
    factory_only = given == ["model.factory"] and not described  # several: config_from_dict names the conflict
    if factory_only and not overrides.get("inputs"):
        raise ConfigError(
            "--factory without --config needs the model's inputs",
            hint="add --input NAME:SHAPE per forward() argument, e.g. --input image:1x3x224x224",
        )
    if factory_only and "outputs" not in overrides:
        overrides["outputs"] = ["output"]
    for spec in overrides.get("inputs") or []:
        for size in spec["shape"]:
            # --dim NAME=... and --set 'dims.NAME={...}' both size a dim
            sized = {
                **(overrides.get("dims") or {}),
                **{k[5:]: v for k, v in overrides.items() if k.startswith("dims.")},
            }
            if isinstance(size, str) and size not in sized:
                import difflib

                close = difflib.get_close_matches(size, list(sized), n=1)
                raise ConfigError(
                    f"--input {spec['name']} names dynamic dim {size!r} and no --dim gives its sizes"
                    + (f" (--dim {close[0]} is given: a typo?)" if close else ""),
                    hint=f"add --dim {size}=MIN:OPT:MAX, e.g. --dim {size}=1:4:8"
                    if not close
                    else f"rename --dim {close[0]}=... to --dim {size}=...",
                )
    # the model comes from flags: relative paths (python_path, --calib) are the working directory's
    return config_from_dict({}, source="<flags>", base_dir=Path.cwd(), overrides=overrides)
