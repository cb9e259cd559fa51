"""Strict TOML-to-attrs structuring with errors that name the key, the value and the fix.

cattrs would structure these classes too, but its errors do not name allowed keys or
values in words a user can act on; config errors are the first thing a user meets.
"""

from __future__ import annotations

import difflib
import enum
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import attrs
from attrs import NOTHING

from slr.errors import ConfigError

T = TypeVar("T")


def option(default: Any = NOTHING, *, doc: str, factory: Any = None, validator: Any = None) -> Any:
    """An attrs field for a config class. ``doc`` is required: it is the reference docs."""
    if factory is not None:
        return attrs.field(factory=factory, validator=validator, metadata={"doc": doc})
    return attrs.field(default=default, validator=validator, metadata={"doc": doc})


def describe_type(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(describe_type(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return f"list of {describe_type(typing.get_args(tp)[0])}"
    if origin is dict:
        return "table"
    if tp is type(None):
        return "none"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(repr(m.value) for m in tp)
    if attrs.has(tp):
        return "table"
    return getattr(tp, "__name__", str(tp))


def _fail(path: str, value: Any, tp: Any, extra: str = "") -> typing.NoReturn:
    raise ConfigError(
        f"{path} = {value!r} is not valid: expected {describe_type(tp)}.{extra and ' ' + extra}"
    )


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
            hint = f"Did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"{path} = {value!r} is not allowed. {hint}Allowed values: "
                + ", ".join(repr(a) for a in allowed)
            )
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        _fail(path, value, tp)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            _fail(path, value, tp)
        item = typing.get_args(tp)[0]
        items = [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            _fail(path, value, tp)
        val_tp = typing.get_args(tp)[1]
        return {str(k): _convert(v, val_tp, f"{path}.{k}") for k, v in value.items()}
    if attrs.has(tp):
        if not isinstance(value, dict):
            _fail(path, value, tp)
        return structure(value, tp, path=path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            _fail(path, value, tp)
    if tp is bool:
        if not isinstance(value, bool):
            _fail(path, value, tp, "Write true or false, without quotes.")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, value, tp)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            _fail(path, value, tp)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            _fail(path, value, tp, "Put the value in quotes.")
        return value
    if tp is Path:
        if not isinstance(value, str | Path):
            _fail(path, value, tp)
        return Path(value)
    raise TypeError(f"config type {tp!r} at {path} is not supported")


def structure(data: dict[str, Any], cls: type[T], *, path: str = "") -> T:
    """Build ``cls`` from a TOML table, rejecting unknown keys and bad values by name.

    A config class may map former key names to what to write instead in a class-level
    ``RENAMED: ClassVar[dict[str, str]]``: such a key fails with that advice, not with
    "unknown key", so an old config says what its key is called now.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in attrs.fields(cls) if f.init}
    prefix = f"{path}." if path else ""
    where = f"[{path}]" if path else "the top level"
    kwargs: dict[str, Any] = {}
    renamed = getattr(cls, "RENAMED", {})
    for key, value in data.items():
        if key not in fields and key in renamed:
            raise ConfigError(f"{prefix}{key} is no longer an option: {renamed[key]}")
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown config key {prefix}{key!r} (value {value!r}).{hint} "
                f"Allowed keys in {where}: {', '.join(fields) or 'none'}"
            )
        kwargs[key] = _convert(value, hints[key], f"{prefix}{key}")
    missing = [n for n, f in fields.items() if f.default is NOTHING and n not in kwargs]
    if missing:
        raise ConfigError(f"missing required config key {prefix}{missing[0]} in {where}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid config in {where}: {exc}") from exc


def unstructure(obj: Any) -> Any:
    """An attrs config object back to TOML-ready data (``None`` values are left out)."""
    if attrs.has(type(obj)):
        out = {}
        for f in attrs.fields(type(obj)):
            value = unstructure(getattr(obj, f.name))
            if value is not None:
                out[f.name] = value
        return out
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, list | tuple):
        return [unstructure(v) for v in obj]
    if isinstance(obj, dict):
        return {k: unstructure(v) for k, v in obj.items()}
    return obj
