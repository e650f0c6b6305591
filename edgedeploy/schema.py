"""Typed loading of plain data (parsed TOML) into frozen dataclasses, with errors that name the key.

Shared by deploy.toml, train.toml, gate policies and target files: unknown keys get the
closest valid key as a hint, wrong types name the dotted key and the expected type.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal

from edgedeploy.errors import ConfigError


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "none"
    return getattr(tp, "__name__", str(tp))


def _is_table(tp: Any) -> bool:
    return (isinstance(tp, type) and dataclasses.is_dataclass(tp)) or typing.get_origin(tp) is dict


def coerce(tp: Any, value: Any, key: str, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value in args:
            return value
        close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(map(str, args))}"
        raise ConfigError(f"{where}: key '{key}' = {value!r} is not allowed", hint=hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(a, value, key, where)
            except ConfigError as exc:
                errors.append(exc)
        tables = [e for a, e in zip([a for a in args if a is not type(None)], errors) if _is_table(a)]
        if len(errors) == 1 or (isinstance(value, dict) and len(tables) == 1):
            # one way to read the value (e.g. an optional table): its own error names the key inside it
            raise (errors[0] if len(errors) == 1 else tables[0]) from None
        raise ConfigError(f"{where}: key '{key}' must be {_type_name(tp)}, got {value!r}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: '{key}' must be a table, got {value!r}")
        return _from_dict(tp, value, key, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: key '{key}' must be a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce(args[0], v, f"{key}[{i}]", where) for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{where}: key '{key}' must have {len(args)} items, got {len(value)}")
        return tuple(coerce(a, v, f"{key}[{i}]", where) for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: '{key}' must be a table, got {value!r}")
        return {k: coerce(args[1], v, f"{key}.{k}", where) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(
            f"{where}: key '{key}' must be true or false, got {value!r}", hint=_type_fix(key, value, bool)
        )
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: key '{key}' must be an integer, got {value!r}", hint=_type_fix(key, value, int))
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: key '{key}' must be a number, got {value!r}", hint=_type_fix(key, value, float))
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: key '{key}' must be a string, got {value!r}", hint=_type_fix(key, value, str))
    raise TypeError(f"unsupported config type {tp!r}")  # programming error


def _type_fix(key: str, value: Any, tp: type) -> str:
    """How to write ``value`` as a TOML value of type ``tp`` for ``key`` (a quoted number is the usual slip)."""
    leaf = key.rsplit(".", 1)[-1]
    if tp is str:
        return f'quote it: {leaf} = "{value}"'
    if tp is bool:
        return f"write {leaf} = true or {leaf} = false, without quotes"
    text = str(value).strip()
    try:
        tp(text)
    except ValueError:
        example = "1" if tp is int else "0.5"
        return f"set {leaf} to a {'whole number' if tp is int else 'number'}, e.g. {leaf} = {example}"
    return f"drop the quotes: {leaf} = {text}"


def _from_dict(cls: type, data: dict[str, Any], prefix: str, where: str, internal: tuple[str, ...] = ()) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name not in internal]
    for key in data:
        if key not in names:
            dotted = f"{prefix}.{key}" if prefix else key
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(names)}"
            raise ConfigError(f"{where}: unknown key '{dotted}'", hint=hint)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in internal:
            continue
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                dotted = f"{prefix}.{f.name}" if prefix else f.name
                raise ConfigError(f"{where}: missing required key '{dotted}'")
            continue
        dotted = f"{prefix}.{f.name}" if prefix else f.name
        kwargs[f.name] = coerce(hints[f.name], data[f.name], dotted, where)
    return cls(**kwargs)


def dataclass_from_dict(cls: type, data: dict[str, Any], where: str, *, internal: tuple[str, ...] = ()) -> Any:
    """Validate ``data`` into the (nested) dataclass ``cls``.

    Args:
        cls: the dataclass; nested dataclass fields are validated recursively.
        data: plain data (parsed TOML / JSON).
        where: file name for messages.
        internal: top-level fields of ``cls`` that are set by code, never by the file.

    Raises:
        ConfigError: unknown or misspelled key, wrong type or missing required key (named, dotted).
    """
    return _from_dict(cls, data, "", where, internal)


def resolve_path(base_dir: str | Path, value: str | None) -> Path | None:
    """``value`` (from a config file) as a path: ``~`` expanded, relative paths against ``base_dir``."""
    if value is None:
        return None
    p = Path(value).expanduser()
    return p if p.is_absolute() else Path(base_dir) / p


def read_toml(path: str | Path, *, what: str, hint: str | None = None) -> dict[str, Any]:
    """Parse a TOML file (``what`` names it in messages, e.g. "config file").

    Raises:
        ConfigError: the file is missing, not UTF-8 text, or not valid TOML.
    """
    from edgedeploy._compat import tomllib

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}", hint=hint)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file", hint=f"save {path} as UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})", hint=_toml_fix(path, text, str(exc))) from None


# what the parser's message means, in the words of the fix: the parser notices most mistakes only after them, at
# the start of the next line or the end of the file
_TOML_CAUSES = (
    ("Unclosed array", "an unclosed [ just before it: close it with ]"),
    ("Unclosed inline table", "an unclosed { just before it: close it with }, on the same line"),
    ("Illegal character '\\n'", "a string without its closing \" or ' on that line"),
    ("Unterminated string", "a string without its closing \" or '"),
    ("Cannot overwrite a value", "a key or table set twice: keep one"),
    ("Cannot declare", "a table declared twice: merge them into one"),
    ("Expected '=' after a key", "write KEY = VALUE, a string value in quotes"),
    ("Invalid value", "a value TOML cannot read: an unquoted string, True for true, a [ or { left open"),
)


def _toml_fix(path: str | Path, text: str, error: str) -> str:
    """The fix for a TOML parse error ``error`` (tomllib's message) in ``text`` read from ``path``: the line to
    edit and what the message says is wrong there."""
    import re

    where = re.search(r"\(at line (\d+), column \d+\)", error)
    line = int(where.group(1)) if where else max(1, len(text.rstrip("\n").splitlines()))
    cause = next((c for key, c in _TOML_CAUSES if key in error), "look at that line and the one before it")
    return f"fix the TOML syntax at {path}:{line} ({cause})"
