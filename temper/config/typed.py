"""Plain dicts <-> typed config dataclasses, with errors that name the key.

``from_dict`` rejects unknown keys (with "did you mean"), wrong types and values
outside a ``Literal``; ``to_dict`` is its inverse, so ``from_dict(to_dict(x)) == x``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union, get_args, get_origin

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from temper.config.errors import ConfigError, did_you_mean

T = TypeVar("T", bound="DataclassInstance")

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    """What ``temper check --explain`` says of one native key."""

    key: str
    doc: str
    type: str
    default: Any
    registry: str | None = None  # the registry whose names it takes


def field_info(cls: type, path: str) -> FieldInfo | None:
    """The doc, type and default of the field at dotted ``path`` in dataclass ``cls``
    (a section included), or None when there is no such field."""
    parts = path.split(".")
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        name = part.removesuffix("[]")  # ``key[]``: the items of a list of sections
        if name not in fields:
            return None
        f, tp = fields[name], _hints(cls)[name]
        if name != part:
            if get_origin(tp) is not list:
                return None
            tp = get_args(tp)[0]
        if i == len(parts) - 1:
            default = to_dict(_field_default(f))
            return FieldInfo(
                path, f.metadata.get("doc", ""), _type_name(tp), default, f.metadata.get("registry")
            )
        inner = next((a for a in get_args(tp) if dataclasses.is_dataclass(a)), tp)
        if not (isinstance(inner, type) and dataclasses.is_dataclass(inner)):
            return None
        cls = inner
    return None


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin is list:
        (arg,) = get_args(tp) or (Any,)
        return f"list[{_type_name(arg)}]"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, key: str, base: Any = None) -> Any:
    """Check ``value`` against type ``tp`` (converting where lossless).

    ``base`` is the value a mapping written for a dataclass section starts from (the
    field's default), so keys the mapping omits keep that default, not the class's.
    """
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, key, base)
            except ConfigError as err:
                errors.append(err)
        if len(errors) == 1:
            raise errors[0]
        raise _type_error(key, value, tp)
    if value is None:
        raise _type_error(key, value, tp)
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            valid = [str(a) for a in allowed]
            raise ConfigError(
                key,
                f"'{value}' is not allowed{did_you_mean(str(value), valid)}",
                f"use one of: {', '.join(valid)}",
            )
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _type_error(key, value, tp)
        return from_dict(tp, value, prefix=key, base=base if isinstance(base, tp) else None)
    if origin is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise _type_error(key, value, tp)
        (arg,) = get_args(tp) or (Any,)
        return [_convert(v, arg, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _type_error(key, value, tp)
        _, varg = get_args(tp) or (str, Any)
        return {str(k): _convert(v, varg, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _type_error(key, value, tp)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _type_error(key, value, tp)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:  # YAML 1.1 reads "1e-6" as a string
                return float(value)
            except ValueError:
                pass
        raise _type_error(key, value, tp)
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise _type_error(key, value, tp)
    return value


def _type_error(key: str, value: Any, tp: Any) -> ConfigError:
    shown = "null" if value is None else repr(value)
    return ConfigError(
        key,
        f"expected {_type_name(tp)}, got {shown} ({type(value).__name__})",
        f"set {key} to a value of type {_type_name(tp)}",
    )


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "", base: T | None = None) -> T:
    """Build dataclass ``cls`` from ``data``; every key must be a field.

    Keys ``data`` omits keep their value in ``base`` when given, else the field default.
    A nested section written in part starts from the field's own default (its
    ``default_factory``), not from the section class's defaults: ``critic.optim`` is
    ``OptimConfig(lr=1e-5)``, so ``critic: {optim: {weight_decay: 0.1}}`` keeps lr 1e-5.
    """
    if not isinstance(data, dict):
        raise _type_error(prefix or cls.__name__, data, cls)
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    names = list(fields)
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in hints:
            where = f"'{prefix}'" if prefix else "the top level"
            raise ConfigError(
                full,
                f"unknown key{did_you_mean(str(key), names)}",
                f"remove it, or use one of the keys of {where}: {', '.join(names)}",
            )
        start = getattr(base, key) if base is not None else None
        if base is None and isinstance(value, dict):
            start = _field_default(fields[key])
        kwargs[key] = _convert(value, hints[key], full, start)
    if base is not None:
        return dataclasses.replace(base, **kwargs)
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Dataclass tree -> plain dicts/lists (full, defaults included)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def diff_from_default(obj: Any) -> dict[str, Any]:
    """Only the fields of ``obj`` that differ from a default-built instance."""
    full = to_dict(obj)
    default = to_dict(type(obj)())
    return _diff(full, default)


def _diff(full: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in full.items():
        base = default.get(key, dataclasses.MISSING)
        if isinstance(value, dict) and isinstance(base, dict) and value and base:
            sub = _diff(value, base)
            if sub:
                out[key] = sub
        elif value != base:
            out[key] = value
    return out
