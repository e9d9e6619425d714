"""A value checked against a field's type: the one type check every config key and every options object's field
passes (bool, int, float, str, Literal choices, lists, tuples, unions with None), with the small conversions YAML
needs (an int where a float goes, a list where a tuple goes, YAML 1.1's yes / no)."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any, Literal

from .errors import ConfigError

# YAML 1.1's boolean words, which StrictLoader (vit/config/loader.py) reads as strings: a key typed bool takes
# them back in check_type, so `--run.compile=yes` means true.
YAML11_BOOLS = {"yes": True, "y": True, "on": True, "true": True, "no": False, "n": False, "off": False,
                "false": False}


def _config_error(key: str, problem: str) -> ConfigError:
    return ConfigError(f"config key '{key}' {problem}")


def check_type(key: str, value: Any, tp: Any, error: Callable[[str, str], ConfigError] = _config_error) -> Any:
    """Return `value` as type `tp`, or raise `error(key, problem)` (default: ConfigError "config key 'key' must be
    ..."; an options object's: OptionError). A list or tuple item is named `key[i]`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        # a list is checked against the union's sequence type first, so that its error is the one reported
        listed = isinstance(value, (list, tuple))
        args = sorted(args, key=lambda a: not (listed and typing.get_origin(a) in (list, tuple)))
        for a in args:
            if a is type(None):
                continue
            try:
                return check_type(key, value, a, error)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1 or listed and typing.get_origin(args[0]) in (list, tuple):
            raise errors[0]  # the one member's (or the sequence member's) own sentence
        kinds = " or ".join(_describe(a) for a in args if a is not type(None))
        raise error(key, f"must be {kinds}, got {type(value).__name__} {value!r}.")
    if origin is Literal:
        choices = typing.get_args(tp)
        if not any(value == c and type(value) is type(c) for c in choices):  # True is not 1
            shown = ", ".join(repr(c) for c in choices if c is not None)
            raise error(key, f"must be one of {shown}, got {value!r}.")
        return value
    if origin in (list, tuple):
        return _check_sequence(key, value, tp, error)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # YAML 1.1 reads '3e-4' (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if tp is bool and isinstance(value, str) and value.lower() in YAML11_BOOLS:  # yes/no/on/off, as YAML 1.1
        return YAML11_BOOLS[value.lower()]
    if tp in (int, float, str, bool) and (type(value) is not tp):
        raise error(key, f"must be {tp.__name__}, got {type(value).__name__} {value!r}.")
    return value


def _describe(tp: Any) -> str:
    """A type as a message names it: bool, a list, one of 'a', 'b'."""
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp) if c is not None)
    if typing.get_origin(tp) in (list, tuple):
        return "a list"
    return getattr(tp, "__name__", str(tp))


def _check_sequence(key: str, value: Any, tp: Any, error: Callable[[str, str], ConfigError]) -> list | tuple:
    """list[X], tuple[X, ...] or tuple[X, Y]: a list or tuple of items of those types (YAML writes both as lists)."""
    origin, items = typing.get_origin(tp), typing.get_args(tp)
    fixed = origin is tuple and Ellipsis not in items  # tuple[int, int]: exactly that many
    if not isinstance(value, (list, tuple)) or (fixed and len(value) != len(items)):
        what = f"a list of {len(items)} values" if fixed else "a list"
        raise error(key, f"must be {what}, got {value!r}.")
    item_types = list(items) if fixed else [items[0]] * len(value)
    out = [check_type(f"{key}[{i}]", v, t, error) for i, (v, t) in enumerate(zip(value, item_types))]
    return out if origin is list else tuple(out)
