"""A **sweep** file: a base config, ``[set]``, ``[grid]`` and ``[zip]`` of config fields, the ``[resources]``
of one run, a ``[scaling]`` study and named ``[presets.NAME]``."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fednest_mpi.errors import UsageError
from fednest_mpi.jobs.values import (
    _check_keys,
    _flatten,
    _int,
    _label,
    _read_toml,
    _string,
    _word,
    parse_time,
    toml_value,
)
from fednest_mpi.text import did_you_mean

SCALING_KINDS = ("strong", "weak")


@dataclass(frozen=True)
class Resources:
    """What one run asks of the batch system."""

    nodes: int = 1
    tasks_per_node: int = 1  #: MPI ranks per node
    cpus_per_task: int = 1  #: cores per rank (torch threads, OMP_NUM_THREADS)
    gpus_per_node: int = 0  #: ``#SBATCH --gpus-per-node`` (omitted when 0)
    time: str = "01:00:00"  #: SLURM time limit
    #: USR1 this long before the time limit, to checkpoint (0: none); a sweep file that does not set it gets
    #: :func:`default_signal_seconds` of its time limit (300 s for limits of 50 min and more, a tenth below)
    signal_seconds: int = 300
    max_restarts: int = 3  #: requeue after the checkpoint signal at most this often
    max_parallel: int = 0  #: array tasks running at once (``%N``; 0: no limit)

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node

    def for_ranks(self, ranks: int) -> "Resources":
        """Fewest nodes of at most ``tasks_per_node`` ranks each that hold ``ranks`` ranks."""
        nodes = -(-ranks // self.tasks_per_node)
        return dataclasses.replace(self, nodes=nodes, tasks_per_node=min(ranks, self.tasks_per_node))


_RESOURCE_FIELDS = tuple(f.name for f in dataclasses.fields(Resources))


def default_signal_seconds(time_limit: str) -> int:
    """The checkpoint signal's lead when a sweep does not choose one: 300 s, or a tenth of a shorter time
    limit (30 s for a 5-minute workstation run), so that every time limit has a default that fits in it."""
    return min(300, parse_time(time_limit) // 10)


def resources_from_dict(data: Mapping, where: str = "resources") -> Resources:
    pre = f"{where}."
    _check_keys(pre, data, _RESOURCE_FIELDS)
    kw: dict[str, Any] = {}
    for key, low in (
        ("nodes", 1),
        ("tasks_per_node", 1),
        ("cpus_per_task", 1),
        ("gpus_per_node", 0),
        ("signal_seconds", 0),
        ("max_restarts", 0),
        ("max_parallel", 0),
    ):
        if key in data:
            kw[key] = _int(pre + key, data[key], low)
    if "time" in data:
        value = data["time"]
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # minutes
        value = _word(pre + "time", value)
        try:
            seconds = parse_time(value)
        except ValueError:
            raise UsageError(
                f"{pre}time: {value!r} is not a SLURM time limit; write e.g. '02:00:00' or '1-12:00:00'"
            ) from None
        if seconds <= 0:
            raise UsageError(f"{pre}time: must be positive, got {value!r}")
        kw["time"] = value
    if "signal_seconds" not in kw:
        kw["signal_seconds"] = default_signal_seconds(kw.get("time", Resources.time))
    res = Resources(**kw)
    if res.signal_seconds and res.signal_seconds >= parse_time(res.time):
        raise UsageError(
            f"{pre}signal_seconds: {res.signal_seconds} s is not less than the time limit {res.time}; "
            "lower it or raise the time limit"
        )
    return res


@dataclass(frozen=True)
class Scaling:
    """A scaling study: the sweep is repeated for every rank count."""

    kind: str  #: strong (same problem) | weak (fields grow with ranks)
    ranks: tuple[int, ...]
    per_rank: Mapping[str, Any] = field(default_factory=dict)  #: weak: field -> value per rank


@dataclass(frozen=True)
class Sweep:
    """A set of runs of one base config (see ``jobs/sweeps/*.toml``)."""

    name: str
    config: str  #: base config (relative to the work directory)
    output_dir: str = "runs"  #: where the run files go
    name_pattern: str = ""  #: e.g. "{algorithm.name}_seed{seed}"; default: varying values
    overwrite: bool = False  #: pass --overwrite to every run
    set: Mapping[str, Any] = field(default_factory=dict)  #: fixed overrides
    grid: Mapping[str, tuple] = field(default_factory=dict)  #: cartesian product
    zip: Mapping[str, tuple] = field(default_factory=dict)  #: lists that vary together
    resources: Resources = field(default_factory=Resources)
    scaling: Scaling | None = None
    description: str = ""
    path: str = ""
    preset: str = ""  #: the preset laid over the file (:func:`apply_preset`); empty: none
    presets: Mapping[str, str] = field(default_factory=dict)  #: the file's presets: name -> description


_SWEEP_FIELDS = (
    "name",
    "description",
    "config",
    "output_dir",
    "name_pattern",
    "overwrite",
    "set",
    "grid",
    "zip",
    "resources",
    "scaling",
    "presets",
)
_PRESET_FIELDS = ("description", "config", "set", "grid", "zip")
_SCALING_FIELDS = ("kind", "ranks", "per_rank")
_RESERVED = ("run.output", "run.overwrite")


def _field_name(where: str, key: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key):
        raise UsageError(f"{where}{key}: not a config field; write section.field, e.g. algorithm.outer_lr")
    if key in _RESERVED:
        raise UsageError(f"{where}{key}: set by the sweep itself; use output_dir, name_pattern and overwrite instead")
    return key


def sweep_from_dict(data: Mapping, where: str = "sweep", name: str = "sweep") -> Sweep:
    """Validate plain data (a parsed sweep TOML) into a :class:`Sweep`."""
    pre = f"{where}: "
    _check_keys(pre, data, _SWEEP_FIELDS)
    if "config" not in data:
        raise UsageError(f'{pre}config: missing; name the base config, e.g. config = "configs/quadratic.toml"')
    kw: dict[str, Any] = {"name": name, "config": _string(pre + "config", data["config"], empty=False)}
    kw["presets"] = {k: str(v.get("description", "")) for k, v in _presets(pre, data).items()}
    if "name" in data:
        kw["name"] = _label(_string(pre + "name", data["name"], empty=False))
    for key in ("description", "output_dir", "name_pattern"):
        if key in data:
            kw[key] = _string(pre + key, data[key])
    if "overwrite" in data:
        if not isinstance(data["overwrite"], bool):
            raise UsageError(f"{pre}overwrite: expected true or false, got {data['overwrite']!r}")
        kw["overwrite"] = data["overwrite"]
    fixed = {_field_name(pre + "set.", k): v for k, v in _flatten(pre + "set", data.get("set", {})).items()}
    for _key, value in fixed.items():
        toml_value(value)  # representable
    axes = _axes(pre, data)
    kw.update(set=fixed, grid=axes["grid"], zip=axes["zip"])
    if not isinstance(data.get("resources", {}), dict):
        raise UsageError(f"{pre}resources: expected a table, got {data['resources']!r}")
    kw["resources"] = resources_from_dict(data.get("resources", {}), f"{where}: resources")
    if "scaling" in data:
        kw["scaling"] = _scaling(pre, data["scaling"])
    sweep = Sweep(**kw)
    varying = list(sweep.grid) + list(sweep.zip) + list(sweep.scaling.per_rank if sweep.scaling else ())
    for key in varying:
        if varying.count(key) > 1 or key in sweep.set:
            raise UsageError(f"{pre}{key}: given in more than one of set, grid, zip, scaling.per_rank; keep one")
    return sweep


def _axes(pre: str, data: Mapping) -> dict[str, dict[str, tuple]]:
    """The ``[grid]`` and ``[zip]`` of a sweep: each field's non-empty list of values; the zip's of one length."""
    axes = {}
    for table in ("grid", "zip"):
        flat = _flatten(pre + table, data.get(table, {}))
        axis = {}
        for key, values in flat.items():
            _field_name(f"{pre}{table}.", key)
            if not isinstance(values, list) or not values:
                raise UsageError(f"{pre}{table}.{key}: expected a non-empty list of values, got {values!r}")
            for v in values:
                toml_value(v)
            axis[key] = tuple(values)
        axes[table] = axis
    lengths = {len(v) for v in axes["zip"].values()}
    if len(lengths) > 1:
        sizes = ", ".join(f"{k}: {len(v)}" for k, v in axes["zip"].items())
        raise UsageError(f"{pre}zip: the lists must have the same length ({sizes})")
    return axes


def _scaling(pre: str, sc: Any) -> Scaling:
    """A sweep's ``[scaling]``: its kind, rank counts and (weak scaling) the fields that grow with the ranks."""
    if not isinstance(sc, dict):
        raise UsageError(f"{pre}scaling: expected a table, got {sc!r}")
    _check_keys(pre + "scaling.", sc, _SCALING_FIELDS)
    kind = sc.get("kind")
    if kind not in SCALING_KINDS:
        raise UsageError(
            f"{pre}scaling.kind: {kind!r} is not one of {', '.join(SCALING_KINDS)}"
            + did_you_mean(str(kind), SCALING_KINDS)
        )
    ranks = sc.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise UsageError(f"{pre}scaling.ranks: expected a non-empty list of rank counts, e.g. [1, 2, 4, 8]")
    ranks = tuple(_int(f"{pre}scaling.ranks[{i}]", r, 1) for i, r in enumerate(ranks))
    if len(set(ranks)) != len(ranks):
        raise UsageError(f"{pre}scaling.ranks: {list(ranks)} repeats a rank count")
    per_rank = {
        _field_name(pre + "scaling.per_rank.", k): v
        for k, v in _flatten(pre + "scaling.per_rank", sc.get("per_rank", {})).items()
    }
    for key, value in per_rank.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"{pre}scaling.per_rank.{key}: expected a number (the value for one rank), got {value!r}")
    if kind == "weak" and not per_rank:
        raise UsageError(
            f"{pre}scaling.per_rank: weak scaling needs the fields that grow with the ranks, "
            "e.g. [scaling.per_rank] algorithm.clients_per_round = 10"
        )
    if kind == "strong" and per_rank:
        raise UsageError(
            f'{pre}scaling.per_rank: strong scaling keeps the problem fixed; drop per_rank or use kind = "weak"'
        )
    return Scaling(kind=kind, ranks=ranks, per_rank=per_rank)


def _presets(pre: str, data: Mapping) -> dict[str, dict]:
    """The ``[presets.NAME]`` tables of a parsed sweep file, checked for their keys."""
    presets = data.get("presets", {})
    if not isinstance(presets, dict) or not all(isinstance(v, dict) for v in presets.values()):
        raise UsageError(
            f"{pre}presets: expected tables [presets.NAME] with set / grid / zip, e.g. [presets.paper.set]"
        )
    for name, table in presets.items():
        _word(f"{pre}presets.{name}", name)
        _check_keys(f"{pre}presets.{name}.", table, _PRESET_FIELDS)
    return presets


def apply_preset(data: Mapping, preset: str, where: str = "sweep") -> dict:
    """The parsed sweep file ``data`` with its preset ``preset`` laid over it (plain data for
    :func:`sweep_from_dict`): the preset's ``config``, if it names one, replaces the base config;
    every field the preset names (in its ``set``, ``grid`` or ``zip``)
    leaves the file's ``set``, ``grid`` and ``zip`` and takes the preset's value or list; the
    preset's ``zip`` lists join the file's remaining ones (all of one length). The runs go to
    ``output_dir/PRESET`` and the sweep is named ``NAME_PRESET``."""
    pre = f"{where}: "
    presets = _presets(pre, data)
    if preset not in presets:
        known = ", ".join(presets) or "none"
        raise UsageError(
            f"{pre}presets: no preset {preset!r} in this sweep (its presets: {known})" + did_you_mean(preset, presets)
        )
    over = presets[preset]
    tables = {t: _flatten(f"{pre}presets.{preset}.{t}", over.get(t, {})) for t in ("set", "grid", "zip")}
    named = {key for table in tables.values() for key in table}
    out = {k: v for k, v in data.items() if k not in ("set", "grid", "zip")}
    for t in ("set", "grid", "zip"):
        kept = {k: v for k, v in _flatten(pre + t, data.get(t, {})).items() if k not in named}
        out[t] = kept | tables[t]
    if "config" in over:
        out["config"] = over["config"]
    out["output_dir"] = f"{data.get('output_dir', 'runs')}/{preset}"
    if "name" in data:
        out["name"] = f"{data['name']}_{preset}"
    return out


def load_sweep(path: str | Path, preset: str = "") -> Sweep:
    """Read and validate a sweep file (``jobs/sweeps/*.toml``); the name defaults to the file's stem.
    With ``preset``, that ``[presets.NAME]`` of the file laid over it (:func:`apply_preset`)."""
    data = _read_toml(path, "sweep")
    stem = _label(Path(path).stem)
    if preset:
        data, stem = apply_preset(data, preset, str(path)), f"{stem}_{preset}"
    sweep = sweep_from_dict(data, str(path), name=stem)
    return dataclasses.replace(sweep, path=str(path), preset=preset)
