"""Command-line flags generated from the config schema, and the key look-ups flags and the Python API share.

Every field of a config section (``[model]``, ``[export]``, ``[precision]``, ``[validate]``, ``[build]``) is
reachable by a flag: the field's ``flag`` metadata names it where a short or historical name reads better
(``precision.mode`` is ``--precision``), otherwise it is the field name with dashes (``precision.calib_resize``
is ``--calib-resize``). Booleans are switches (``--simplify`` / ``--no-simplify``); tuples take comma-separated
values (``--calib-resize 224,224``); tables take JSON (``--kwargs '{"classes": 10}'``). Anything else
(``tolerance.int8.min_cosine``, ``gate.*``) is set with ``--set KEY=VALUE``. ``--input``, ``--dim`` and
``--output`` describe the model's inputs and outputs without a config file.

Nothing here imports torch; every parser raises :class:`ConfigError` naming the flag.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edgedeploy.errors import ConfigError

# Sections whose fields get generated flags (tables of tables and the [gate] policy go through --set).
FLAG_SECTIONS = ("model", "export", "precision", "validate", "build")
# Help for fields whose metadata carries none (a field's own ``help`` metadata wins); a field missing from
# both still gets a flag, described by its key and default.
HELP = {
    "model.kwargs": "keyword arguments of the factory, as JSON",
    "model.python_path": "folders the factory's module is imported from (default: the config's folder)",
    "model.class_names": "class names of a classifier's outputs, in order",
    "model.normalization": 'input normalization as JSON {"mean": [...], "std": [...]}',
    "export.fail_on_tracer_warnings": "fail tracing on a TracerWarning at your own line",
    "export.edge_probe": "also probe capture and export at the inputs' range edges (zeros, both ends)",
    "precision.calib_resize": "HEIGHT,WIDTH calibration images are resized to (needed for dynamic H/W)",
    "precision.calib_layout": "layout of image-folder calibration tensors: NCHW or NHWC",
    "precision.calib_samples": "calibration samples used at most",
    "precision.per_channel": "per-channel INT8 weight scales",
    "precision.reduce_range": "7-bit INT8 weights: auto (measured where it matters), on or off",
    "precision.accuracy_target": "held-out score the reduced-precision model must reach (default: from the tolerance)",
    "precision.max_fallback_tries": "quantizations the float-fallback search may spend",
    "precision.keep_fp32": "ONNX node names kept in float",
    "precision.time_budget_s": "seconds the INT8 fallback search may run (default: no limit)",
    "validate.goldens_budget_mb": "size bound of goldens.npz in MB (default: the larger of 8 MB and twice the weights)",
    "validate.classifier_outputs": "outputs judged by top-k agreement (classifier logits)",
    "validate.topk": "k of the top-k agreement",
    "validate.latency_warmup": "untimed runs before timing",
    "build.jetson": "the Jetson profile --target jetson means off a Jetson",
}


@dataclass(frozen=True)
class FlagField:
    """One CLI flag and the config field it sets.

    Attributes:
        kind: how the flag's text is read: ``bool`` (a switch), ``bool-auto`` (a switch that also takes
            ``auto``), ``int``, ``float``, ``str``, ``choice``, ``ints`` / ``floats`` / ``strs`` (comma-separated),
            ``json``. ``choices``: the words a field also takes (``Literal`` members).
    """

    flag: str
    dotted: str
    type: Any
    help: str
    path: bool = False
    kind: str = "str"
    choices: tuple[str, ...] = ()
    default: Any = None

    @property
    def negative(self) -> str:
        """The ``--no-...`` form of a switch."""
        return "--no-" + self.flag[2:]


def _members(tp: Any) -> list[Any]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def _kind(tp: Any) -> tuple[str, tuple[str, ...]] | None:
    """(kind, choices) for a field type, or None when no flag can express it."""
    members = _members(tp)
    base = members[0]
    literals = tuple(str(v) for a in members if typing.get_origin(a) is Literal for v in typing.get_args(a))
    if base is bool:
        return ("bool-auto", literals) if literals else ("bool", ())
    if typing.get_origin(base) is Literal:
        return "choice", literals
    if base in (int, float, str):
        return base.__name__, literals  # int | Literal["auto"]: the words are accepted as they are
    if typing.get_origin(base) is tuple:
        args = typing.get_args(base)
        item = args[0] if args else str
        return {int: ("ints", ()), float: ("floats", ()), str: ("strs", ())}.get(item)
    if typing.get_origin(base) is dict or base is dict:
        return "json", ()
    return None


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def flag_fields() -> list[FlagField]:
    """Every config field reachable by a dedicated flag, in declaration order; flag names are unique."""
    from edgedeploy.config import DeployConfig

    out: list[FlagField] = []
    taken: set[str] = set()
    hints = typing.get_type_hints(DeployConfig)
    for name in FLAG_SECTIONS:
        section = hints[name]
        sub_hints = typing.get_type_hints(section)
        for f in dataclasses.fields(section):
            kind = _kind(sub_hints[f.name])
            if kind is None or f.metadata.get("flag", "") is None:
                continue
            flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
            if flag in taken:  # two sections with one field name: the later one is prefixed by its section
                flag = f"--{name}-{f.name.replace('_', '-')}"
            taken.add(flag)
            default = _default(f)
            help_text = (
                f.metadata.get("help") or HELP.get(f"{name}.{f.name}") or f"{name}.{f.name} (default {default!r})"
            )
            out.append(
                FlagField(
                    flag,
                    f"{name}.{f.name}",
                    sub_hints[f.name],
                    help_text,
                    f.metadata.get("path", False),
                    kind[0],
                    kind[1],
                    default,
                )
            )
    return out


def _split(text: str, seps: str = ",") -> list[str]:
    return [p.strip() for p in re.split(f"[{re.escape(seps)}]", text) if p.strip()]


def parse_flag_value(ff: FlagField, text: Any) -> Any:
    """Turn a flag's text into the field's value (no eval); switches may already hold a bool.

    Raises:
        ConfigError: the text does not parse as the field's type.
    """
    if isinstance(text, bool):
        return text
    if ff.kind in ("bool", "bool-auto"):
        if ff.kind == "bool-auto" and text in ff.choices:
            return text  # bool | Literal["auto"]: the word itself
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        words = "true/false" + "".join(f"/{c}" for c in ff.choices)
        raise ConfigError(
            f"flag {ff.flag}: expected {words}, got {text!r}", hint=f"use {ff.flag} or {ff.negative} alone"
        )
    if ff.choices and text in ff.choices:
        return text
    if ff.path:
        return str(Path(text).expanduser().resolve())
    if ff.kind == "int":
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"flag {ff.flag}: expected an integer, got {text!r}") from None
    if ff.kind == "float":
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"flag {ff.flag}: expected a number, got {text!r}") from None
    if ff.kind == "choice" and text not in ff.choices:
        close = difflib.get_close_matches(text, ff.choices, n=1)
        raise ConfigError(
            f"flag {ff.flag}: {ff.dotted} = {text!r} is not allowed",
            hint=f"did you mean {ff.flag} {close[0]}?" if close else f"use one of {', '.join(ff.choices)}",
        )
    if ff.kind == "ints":
        try:
            return [int(p) for p in _split(text, ",x")]
        except ValueError:
            raise ConfigError(f"flag {ff.flag}: expected integers such as 224,224, got {text!r}") from None
    if ff.kind == "floats":
        try:
            return [float(p) for p in _split(text)]
        except ValueError:
            raise ConfigError(f"flag {ff.flag}: expected numbers such as 0.5,1.5, got {text!r}") from None
    if ff.kind == "strs":
        return _split(text)
    if ff.kind == "json":
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"flag {ff.flag}: expected a JSON object, got {text!r} ({exc.msg})") from None
        if not isinstance(value, dict):
            raise ConfigError(f"flag {ff.flag}: expected a JSON object such as '{{\"k\": 1}}', got {text!r}")
        return value
    return text


# ---- keys: what --set and the Python API's keywords may name -------------------------------------------


def _schema_keys(tp: Any, prefix: str) -> list[str]:
    keys: list[str] = []
    for member in _members(tp):
        if isinstance(member, type) and dataclasses.is_dataclass(member):
            hints = typing.get_type_hints(member)
            for f in dataclasses.fields(member):
                dotted = f"{prefix}.{f.name}" if prefix else f.name
                keys.append(dotted)
                keys += _schema_keys(hints[f.name], dotted)
        elif typing.get_origin(member) is dict and prefix == "tolerance":
            from edgedeploy.config import DEFAULT_TOLERANCES

            for precision in DEFAULT_TOLERANCES:
                keys.append(f"{prefix}.{precision}")
                keys += _schema_keys(typing.get_args(member)[1], f"{prefix}.{precision}")
    return keys


def known_keys() -> list[str]:
    """Every dotted key of deploy.toml a flag or keyword may set (tables included, ``dims.*`` excepted)."""
    from edgedeploy.config import INTERNAL_FIELDS, DeployConfig

    return [k for k in _schema_keys(DeployConfig, "") if k.split(".")[0] not in INTERNAL_FIELDS]


def _is_known(dotted: str, keys: list[str]) -> bool:
    if dotted in keys:
        return True
    parts = dotted.split(".")
    if parts[0] == "dims" and len(parts) in (2, 3):  # dims.<name>[.min|opt|max]: names are the user's
        return len(parts) == 2 or parts[2] in ("min", "opt", "max")
    if parts[0] == "model" and len(parts) >= 3 and parts[1] in ("kwargs", "normalization"):
        return True  # free-form tables
    return False


def closest_key(dotted: str, keys: list[str] | None = None) -> str | None:
    """The known key ``dotted`` most likely meant: same last part first (``target`` -> ``build.target``),
    then the closest spelling of the whole key or of its last part."""
    keys = keys if keys is not None else known_keys()
    leaf = dotted.split(".")[-1]
    same_leaf = [k for k in keys if k.split(".")[-1] == leaf]
    if same_leaf:
        return same_leaf[0]
    whole = difflib.get_close_matches(dotted, keys, n=1, cutoff=0.7)
    if whole:
        return whole[0]
    leaves = {k.split(".")[-1]: k for k in reversed(keys)}
    near = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.75)
    return leaves[near[0]] if near else None


def check_override_keys(keys: list[str], *, spell: typing.Callable[[str], str], what: str) -> None:
    """Refuse an override naming no config key, in the caller's own spelling (``build__target``, ``--set``).

    Args:
        keys: dotted keys to check.
        spell: how the caller writes a dotted key (e.g. ``lambda k: k.replace(".", "__")`` for keywords).
        what: what the caller calls an override in the message ("keyword", "--set key").

    Raises:
        ConfigError: a key that is not in the schema, with the closest one in the caller's spelling.
    """
    known = known_keys()
    for dotted in keys:
        if _is_known(dotted, known):
            continue
        close = closest_key(dotted, known)
        raise ConfigError(
            f"unknown {what} {spell(dotted)!r}: no config key {dotted!r}",
            hint=f"did you mean {spell(close)}?" if close else "see the config reference (docs/cli.md)",
        )


def parse_set(text: str) -> tuple[str, Any]:
    """``--set KEY=VALUE``: the value read as a TOML value (``0.97``, ``true``, ``[1, 2]``), else as a string.

    Raises:
        ConfigError: no ``=``, or a key that is not in the schema.
    """
    from edgedeploy._compat import tomllib

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(
            f"flag --set: expected KEY=VALUE, got {text!r}", hint="e.g. --set tolerance.int8.min_cosine=0.97"
        )
    check_override_keys([key], spell=lambda k: k, what="--set key")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key, value


# ---- inputs, dims and outputs from flags -------------------------------------------------------------------

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")


def parse_input(text: str) -> dict[str, Any]:
    """``--input NAME:SHAPE[:DTYPE]``, SHAPE ``1x3x224x224`` or ``batch,3,224,224`` (named dims are dynamic).

    Raises:
        ConfigError: a malformed spec, with an example.
    """
    example = "e.g. --input image:1x3x224x224 or --input image:batchx3x224x224 --dim batch=1:4:8"
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise ConfigError(f"flag --input: expected NAME:SHAPE[:DTYPE], got {text!r}", hint=example)
    name, shape_text = parts[0], parts[1]
    sizes = _split(shape_text) if "," in shape_text else _split(shape_text, "x")
    shape: list[int | str] = []
    for size in sizes:
        if size.isdigit():
            shape.append(int(size))
        elif _NAME.match(size):
            shape.append(size)
        else:
            raise ConfigError(
                f"flag --input: {text!r}: size {size!r} is neither an integer nor a dim name", hint=example
            )
    spec: dict[str, Any] = {"name": name, "shape": shape}
    if len(parts) == 3:
        spec["dtype"] = parts[2]
    return spec


def parse_dim(text: str) -> tuple[str, dict[str, int]]:
    """``--dim NAME=MIN:OPT:MAX`` (or ``NAME=N`` for one size).

    Raises:
        ConfigError: a malformed spec, with an example.
    """
    name, sep, sizes = text.partition("=")
    try:
        values = [int(v) for v in sizes.split(":")] if sep and name else []
    except ValueError:
        values = []
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise ConfigError(f"flag --dim: expected NAME=MIN:OPT:MAX, got {text!r}", hint="e.g. --dim batch=1:4:8")
    return name.strip(), dict(zip(("min", "opt", "max"), values))


def model_overrides(inputs: list[str] | None, dims: list[str] | None, outputs: list[str] | None) -> dict[str, Any]:
    """Top-level config entries from ``--input`` / ``--dim`` / ``--output`` (each replaces the config's own).

    Raises:
        ConfigError: a malformed flag, or an input naming a dim no ``--dim`` (or config table) gives.
    """
    raw: dict[str, Any] = {}
    if inputs:
        raw["inputs"] = [parse_input(t) for t in inputs]
    if dims:
        raw["dims"] = dict(parse_dim(t) for t in dims)
    if outputs:
        raw["outputs"] = [o for text in outputs for o in _split(text)]
    return raw
