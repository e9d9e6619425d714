"""Strict loading: a nested dict to the typed `Config` (unknown keys and wrong types refused by dotted key, the
options objects a section nests made by the one convention, `options_from`), and back to plain data."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from .combinations import validate
from .errors import ConfigError, OptionError
from .options import UnknownOption, nest_sparse_keys, options_from
from .schema import Config, ModelConfig
from .types import check_type


def from_dict(data: dict | None, cls: type = Config, prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict, strictly (unknown keys and wrong types raise ConfigError with
    the dotted key); a whole `Config` is also range-checked (`validate`)."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{prefix or 'root'}' must be a mapping, got {data!r}.")
    if cls is ModelConfig:
        data = nest_sparse_keys(data, prefix)  # configs saved with the flat sparse_* keys
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown config key '{prefix}{unknown[0]}'; valid keys here: {', '.join(sorted(names))}"
                          f"{colon_hint(str(unknown[0]))}.")
    kwargs = {}
    for name, value in data.items():
        key, tp = f"{prefix}{name}", hints[name]
        options = optional_dataclass(tp)
        if dataclasses.is_dataclass(tp):
            kwargs[name] = from_dict(value, tp, key + ".")
        elif options is not None:  # an options object or null (e.g. model.sparse_attention, model.rope)
            kwargs[name] = options_at(key, options, value)
        else:
            kwargs[name] = check_type(key, value, tp)
    obj = cls(**kwargs)
    if cls is Config:
        validate(obj)
    return obj


def colon_hint(key: str) -> str:
    """YAML reads {a:1} as the key 'a:1' (a flow mapping needs a space after the colon): say so."""
    name, colon, rest = key.partition(":")
    return f" (YAML needs a space after the colon: write {{{name}: {rest}}})" if colon and rest[:1] != " " else ""


def options_at(key: str, cls: type, value: Any) -> Any:
    """`options_from(cls, value)` for the config key `key` (e.g. model.rope): its errors named by dotted key."""
    if value is not None and not isinstance(value, (dict, cls)):
        raise ConfigError(f"config key '{key}' must be a mapping of {cls.__name__} fields or null, got {value!r}.")
    try:
        return options_from(cls, value)
    except UnknownOption as e:
        raise ConfigError(f"unknown config key '{key}.{e.key}'; valid keys here: {', '.join(e.valid)}"
                          f"{colon_hint(str(e.key))}.") from None
    except OptionError as e:  # a missing or mistyped field, or the object's own check
        raise ConfigError(f"config key '{key}.{e.key}' {e.problem}") from None


def optional_dataclass(tp: Any) -> type | None:
    """The dataclass of a `SomeOptions | None` field, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        classes = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        return classes[0] if len(classes) == 1 and type(None) in typing.get_args(tp) else None
    return None


def _plain(value: Any) -> Any:
    """Tuples (an options object's grids and stage lists) as lists, which YAML and JSON write."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def to_dict(cfg: Any) -> dict:
    """The config as plain data (dicts, lists, scalars): what config.yaml holds and `from_dict` reads back."""
    return _plain(dataclasses.asdict(cfg))


def diff(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """{'section.key': (old value, new value)} for every key whose value differs."""
    a, b = to_dict(old), to_dict(new)
    return {f"{s}.{k}": (a[s][k], b[s][k]) for s in a for k in a[s] if a[s][k] != b[s][k]}
