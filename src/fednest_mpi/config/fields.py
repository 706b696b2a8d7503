"""The machinery of parameter classes: a documented field (:func:`spec`), and the checks that turn
plain TOML/JSON values into a frozen dataclass (:func:`coerce`, :func:`check_range`, :func:`build_section`).

Every section of a config -- the built-in problems and algorithms, the plugins' ``Params``, ``[run]`` and
``[federation]`` -- is a frozen dataclass whose fields carry their meaning, default and allowed values in
their metadata; validation and the reference (``fednest-mpi config-doc``) read that metadata and nothing else.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from fednest_mpi.errors import ConfigError
from fednest_mpi.text import did_you_mean


def spec(default, help: str, *, choices=None, low=None, high=None, low_open=False):
    """A dataclass field with its documentation and its allowed values."""
    meta = {"help": help, "choices": choices, "low": low, "high": high, "low_open": low_open}
    return field(default=default, metadata=meta)


INT_LIMIT = 2**63  # integer fields are int64 in numpy and torch
SEED_MAX = 2**64 - 1  # the seed is a uint64 key (rng.py)


def fields_of(cls: type) -> dict[str, dataclasses.Field]:
    """The fields of parameter class ``cls`` by name."""
    return {f.name: f for f in dataclasses.fields(cls)}


def coerce(path: str, value: Any, typ: Any) -> Any:
    """Check ``value`` against the annotated type; ints are accepted where floats are expected."""
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -INT_LIMIT <= value <= (SEED_MAX if path == "seed" else INT_LIMIT - 1):
                raise ConfigError(f"{path}: {value} does not fit in a 64-bit integer; choose a smaller value")
            return value
        raise ConfigError(f"{path}: expected an integer, got {value!r}")
    if typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(float(value)):
                raise ConfigError(f"{path}: expected a finite number, got {value!r}")
            return float(value)
        raise ConfigError(f"{path}: expected a number, got {value!r}")
    if typ is str:
        if isinstance(value, str):
            return value
        raise ConfigError(  # a path or a name that TOML reads as a number, a boolean, a list: 1e3, true, [1]
            f"{path}: expected a string, got {value!r}; put the text in quotes, as a TOML string "
            f"(on the command line: --set '{path}=\"...\"')"
        )
    raise TypeError(f"unsupported config type {typ!r}")


def check_range(path: str, value: Any, meta: Mapping) -> None:
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(
            f"{path}: {value!r} is not one of {', '.join(map(repr, choices))}" + did_you_mean(str(value), choices)
        )
    low, high = meta.get("low"), meta.get("high")
    if low is not None:
        if meta.get("low_open") and not value > low:
            raise ConfigError(f"{path}: must be > {low}, got {value!r}")
        if not meta.get("low_open") and not value >= low:
            raise ConfigError(f"{path}: must be >= {low}, got {value!r}")
    if high is not None and not value <= high:
        raise ConfigError(f"{path}: must be <= {high}, got {value!r}")


def build_section(cls: type, data: Any, path: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of fields, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in data:
        if name not in fields:
            raise ConfigError(
                f"{path}.{name}: unknown field" + did_you_mean(name, fields) + f"; known fields: {', '.join(fields)}"
            )
    values = {}
    for name, f in fields.items():
        if name not in data:
            continue
        where = f"{path}.{name}"
        values[name] = coerce(where, data[name], hints[name])
        if name != "name":  # a section's name was resolved by its registry (a plugin's may be 'module:Class')
            check_range(where, values[name], f.metadata)
    return cls(**values)


def check_defaults(kind: str, name: str, cls: type) -> None:
    """Every default of the parameter class ``cls`` of the ``kind`` (problem, algorithm) ``name`` is a value its
    own field accepts (its type, choices and range): a config that does not set a field hands the default to the
    plugin unchecked (a float field's default ``"1.0"`` reached the plugin as text)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING:
            continue
        try:
            check_range(f.name, coerce(f.name, f.default, hints[f.name]), f.metadata)
        except ConfigError as exc:
            why = str(exc).removeprefix(f"{f.name}: ").split(";")[0]
            raise ConfigError(
                f"{kind} {name!r}: its parameter class {cls.__qualname__!r}: field {f.name!r} has the default "
                f"{f.default!r}, which the field refuses ({why}); give it a default of its type "
                f"({hints[f.name].__name__}) and range"
            ) from None
