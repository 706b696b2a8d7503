"""From files and ``--set`` overrides to a validated :class:`~fednest_mpi.config.RunConfig`: reading
TOML/JSON with its ``base`` chain, merging layers, overrides, building the sections; and the flat views
(dotted field names) that reports and checkpoints compare."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import tomllib
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fednest_mpi.config.fields import SEED_MAX, build_section, check_defaults, check_range, coerce, fields_of
from fednest_mpi.config.registries import NAMED_SECTIONS, section_fields
from fednest_mpi.config.run_params import SECTIONS, RunConfig
from fednest_mpi.config.validation import validate_relations
from fednest_mpi.errors import ConfigError
from fednest_mpi.pathkind import not_a_file
from fednest_mpi.text import did_you_mean


def _build_named(section: str, data: Any, default: str):
    """The parameter object of the problem or algorithm (``section``) named in ``data``. A field of
    another problem (algorithm) is an error naming both, unless it states that field's default (it then
    changes nothing: a sweep may zip a field over algorithms that lack it); a field of none is unknown."""
    if not isinstance(data, dict):
        raise ConfigError(f"{section}: expected a table of fields, got {data!r}")
    registry = NAMED_SECTIONS[section]
    name = data.get("name", default)
    spec_ = registry.resolve(name) if isinstance(name, str) else None
    if spec_ is None and section == "problem":
        raise ConfigError(
            f"problem.name: unknown problem {name!r}"
            + did_you_mean(str(name), registry.names())
            + f"; choose from {', '.join(registry.names())}, or name a plugin class as 'module:Class'"
        )
    if spec_ is None:
        raise ConfigError(
            f"{section}.name: {name!r} is not one of {', '.join(map(repr, registry.names()))}"
            + did_you_mean(str(name), registry.names())
            + ", or name a plugin class as 'module:Class'"
        )
    check_defaults(section, name, spec_.params)
    own, kept = fields_of(spec_.params), {}
    for key, value in data.items():
        owners = [s for s in registry.values() if key not in own and key in fields_of(s.params)]
        if not owners:
            kept[key] = value
            continue
        f = fields_of(owners[0].params)[key]
        where = f"{section}.{key}"
        if coerce(where, value, typing.get_type_hints(owners[0].params)[key]) != f.default:
            kind = f" ({spec_.kind})" if hasattr(spec_, "kind") else ""
            raise ConfigError(
                f"{where}: does not apply to {section} {name!r}{kind}; it is a field of "
                f"{', '.join(s.name for s in owners)}; remove it{did_you_mean(key, own)}"
            )
    return build_section(spec_.params, kept, section)


def from_dict(data: dict) -> RunConfig:
    """Build and validate a :class:`RunConfig` from plain data (TOML/JSON tables)."""
    if not isinstance(data, dict):
        raise ConfigError("config: expected a table at the top level")
    known = {f.name for f in dataclasses.fields(RunConfig)}
    for name in data:
        if name not in known:
            raise ConfigError(
                f"{name}: unknown section or field" + did_you_mean(name, known) + f"; known: {', '.join(sorted(known))}"
            )
    kwargs = {}
    if "seed" in data:
        kwargs["seed"] = coerce("seed", data["seed"], int)
        check_range("seed", kwargs["seed"], {"low": 0, "high": SEED_MAX})
    if "problem" in data:
        kwargs["problem"] = _build_named("problem", data["problem"], "quadratic")
    if "algorithm" in data:
        kwargs["algorithm"] = _build_named("algorithm", data["algorithm"], "fednest")
    for name, cls in SECTIONS.items():
        if name in data:
            kwargs[name] = build_section(cls, data[name], name)
    cfg = RunConfig(**kwargs)
    validate_relations(cfg)
    return cfg


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value); the value is read as TOML (bare words become strings)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected section.field=value, e.g. --set algorithm.outer_lr=0.05")
    keypath, raw = text.split("=", 1)
    keys = [k.strip() for k in keypath.split(".")]
    if not all(keys):
        raise ConfigError(f"--set {text!r}: empty field name in {keypath!r}")
    try:
        table = tomllib.loads(f"v = {raw}")
        value = table["v"]
    except tomllib.TOMLDecodeError as exc:
        if raw.lstrip()[:1] in ('"', "'"):  # meant as a TOML string: never kept as a bare word, quotes and all
            raise ConfigError(
                f"--set {keypath}: {raw!r} starts with a quote but is not one TOML string ({exc}); "
                "close the quotes, or pass the value without them"
                + (" (or use --output PATH)" if keypath.strip() == "run.output" else "")
            ) from None
        value = raw  # a bare word: the string as the shell passed it (any bytes, any characters)
    except RecursionError:
        raise ConfigError(f"--set {keypath}: the value is nested too deeply") from None
    else:
        if len(table) > 1:  # 'a=1\nb=2': a line break and more TOML after the value, never dropped unread
            more = ", ".join(repr(key) for key in table if key != "v")
            raise ConfigError(
                f"--set {keypath}: {raw!r} holds more than one value (a line break, then {more}); "
                "give one field per --set, e.g. --set a.b=1 --set c.d=2"
            )
    _check_values(Path("--set"), {keypath: value})
    return keys, value


def apply_overrides(data: dict, overrides: list[str], values: Mapping[str, Any] | None = None) -> dict:
    """Return a copy of ``data`` with every ``--set`` override applied, then every ``values`` entry
    (``{"run.output": path}``: a value as it is, never parsed, so that a path holding any characters or
    bytes stays that path). An override that names a problem or an algorithm leaves the fields of
    ``data``'s problem (algorithm) that the named one lacks behind (:func:`section_fields`)."""
    data = json.loads(json.dumps(data))
    parsed = [(*parse_override(text), text) for text in overrides]
    parsed += [(dotted.split("."), value, dotted) for dotted, value in (values or {}).items()]
    named: dict[str, dict] = {}
    for keys, value, _ in parsed:
        if len(keys) == 2 and keys[0] in NAMED_SECTIONS and keys[1] == "name":
            named[keys[0]] = {"name": value}
    data = _named_sections(data, named)
    for keys, value, text in parsed:
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: {k!r} is a field, not a section")
        node[keys[-1]] = value
    return data


def _named_sections(lower: dict, upper: Mapping) -> dict:
    """``lower`` with its [problem] and [algorithm] tables cut to the fields of the problem and algorithm
    that an upper layer ``upper`` names, where it names one (:func:`section_fields`)."""
    out = dict(lower)
    for section in NAMED_SECTIONS:
        table, named = lower.get(section), upper.get(section)
        if isinstance(table, dict) and isinstance(named, dict) and "name" in named:
            out[section] = section_fields(section, named["name"], table)
    return out


def merge_layers(base: dict, top: dict) -> dict:
    """``top`` over ``base``, table by table (``base``'s other problem's and algorithm's fields left behind)."""
    out = _named_sections(base, top)
    for name, value in top.items():
        out[name] = (
            merge_layers(out[name], value) if isinstance(value, dict) and isinstance(out.get(name), dict) else value
        )
    return out


MAX_DEPTH = 32  # tables and arrays nested deeper than this are no config of ours (and recursion stays bounded)


def _no_duplicates(pairs: list) -> dict:
    """``json.loads`` object hook: a key given twice is refused (TOML refuses it itself)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{key!r} is given twice in the same object; keep one")
        out[key] = value
    return out


def _check_values(p: Path, data: dict) -> None:
    """Refuse what no field holds: TOML dates and times, and nesting deeper than :data:`MAX_DEPTH`."""
    todo: list[tuple[str, Any, int]] = [(key, value, 1) for key, value in data.items()]
    while todo:
        where, value, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(f"config file {str(p)!r}: {where} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, datetime.date | datetime.time):  # datetime.datetime is a date
            raise ConfigError(
                f"{where}: {value.isoformat()} is a TOML date/time, which no config field holds; "
                "write it as a string (in quotes) or a number"
            )
        if isinstance(value, dict):
            todo += [(f"{where}.{key}", item, depth + 1) for key, item in value.items()]
        elif isinstance(value, list):
            todo += [(f"{where}[{i}]", item, depth + 1) for i, item in enumerate(value)]


def _read_one(p: Path) -> dict:
    """The plain data of one config file (its ``base`` not followed)."""
    instead = not_a_file(p)  # a folder, a FIFO (which would block the read), a device, a link loop, nothing
    if instead is not None:
        raise ConfigError(
            f"config file {str(p)!r} {instead}; pass the path of a TOML file, such as configs/quadratic.toml"
        )
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(p)!r} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
            "save it as UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(f"config file {str(p)!r} cannot be read ({exc.strerror or exc})") from None
    kind = "JSON" if p.suffix == ".json" else "TOML"
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates) if kind == "JSON" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:  # json.JSONDecodeError and duplicate keys are ValueErrors
        raise ConfigError(f"config file {str(p)!r} is not valid {kind}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {str(p)!r}: its values are nested too deeply to read") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(p)!r}: expected a table (a JSON object) at the top level, got a {type(data).__name__}"
        )
    _check_values(p, data)
    return data


def read_file(path: str | Path) -> dict:
    """The plain data of a TOML (or JSON) config file, with its ``base`` chain resolved.

    A top-level ``base = "other.toml"`` (relative to the file) names a config whose values this
    file overrides, table by table, so a family of configs shares one base and each member states
    only what differs (``configs/mnist/``). Chains of any length are read (a loop is refused).
    """
    if os.fspath(path) == "":  # Path("") is the current folder
        raise ConfigError(
            "the config file's path is empty; pass the path of a TOML file, such as configs/quadratic.toml"
        )
    p = Path(path)
    layers = [_read_one(p)]
    if layers[0] == {}:
        raise ConfigError(
            f"config file {str(p)!r} is empty; a config needs at least the sections [problem] and [algorithm] "
            "(every other field has a default), e.g. a copy of configs/quadratic.toml"
        )
    seen = {p.resolve()}
    while "base" in layers[-1]:
        base = layers[-1].pop("base")
        if not isinstance(base, str):
            raise ConfigError(f"{p}: base: expected the path of a config file, got {base!r}")
        base_path = (p.parent / base).resolve()
        if base_path in seen:
            raise ConfigError(f"{p}: base: {base!r} leads back to itself; remove the cycle")
        seen.add(base_path)
        p = base_path
        layers.append(_read_one(p))
    data = layers.pop()
    while layers:
        data = merge_layers(data, layers.pop())
    return data


REQUIRED = ("problem", "algorithm")  # sections a config file must name (every field within has a default)


def load(path: str | Path | None, overrides: Sequence[str] = (), values: Mapping[str, Any] | None = None) -> RunConfig:
    """Read a TOML (or JSON) config (and its ``base`` chain), apply the ``--set`` overrides and then
    ``values`` (:func:`apply_overrides`), validate."""
    data = apply_overrides(read_file(path) if path is not None else {}, list(overrides), values)
    cfg = from_dict(data)  # its errors first: they name a field
    missing = [name for name in REQUIRED if path is not None and name not in data]
    if missing:
        raise ConfigError(
            f"config file {str(path)!r} has no [{missing[0]}] section; a config names at least its [problem] and "
            'its [algorithm] (e.g. [algorithm] with name = "fednest"; every other field has a default), '
            "see configs/quadratic.toml"
        )
    return cfg


def flatten_config(data: Mapping[str, Any], prefix: str = "", hashable: bool = True) -> dict[str, Any]:
    """Nested config dict -> ``{"algorithm.outer_lr": 0.2, ..., "seed": 0}`` (dotted names, as in ``--set``).

    ``hashable``: lists become tuples, so that values can be grouped and compared as keys.
    """
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, name + ".", hashable))
        elif hashable and isinstance(value, list):
            flat[name] = tuple(value)
        else:
            flat[name] = value
    return flat


def differing_fields(flat_configs: Sequence[Mapping[str, Any]], ignore: Iterable[str] = ()) -> dict[str, list]:
    """``{dotted field: [value in each config]}`` for the fields of flattened configs whose values are
    not all the same (compared as JSON, sorted by name); a field missing from a config is None there."""
    ignore = frozenset(ignore)
    keys = set().union(*(set(c) for c in flat_configs)) - ignore
    diffs = {}
    for key in sorted(keys):
        values = [c.get(key) for c in flat_configs]
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1:
            diffs[key] = values
    return diffs
