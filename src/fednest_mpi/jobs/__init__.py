"""Batch jobs for sweeps of runs: SLURM scripts (one run, job arrays) and a workstation script.

Three kinds of files, all TOML except the templates:

* a **site** file (:func:`load_site`): everything that belongs to one machine -- account,
  partition, QOS, modules, virtual environment, MPI launcher and its flags, extra environment.
  Templates hold no site specifics. The built-in sites (``local``, ``example-cluster``) are package
  data in ``sites/`` beside this module and are named by their stem; any other site is a path.
* a **sweep** file (``jobs/sweeps/*.toml``, :func:`load_sweep`): a base config, fixed ``[set]``
  overrides, a ``[grid]`` (cartesian product) and a ``[zip]`` (lock-step lists) of config
  fields, the ``[resources]`` of one run, optionally a ``[scaling]`` study over rank counts, and
  named ``[presets.NAME]`` (:func:`apply_preset`): each a ``description``, optionally its own base
  ``config``, and its own ``set`` / ``grid`` / ``zip`` laid over the file's, e.g. a figure under the
  paper's stated settings and under the authors' published scripts (``jobs/sweeps/fig*.toml``:
  ``paper``, ``authors_code``).
* the **templates** (package data in ``templates/`` beside this module, or a folder passed as
  ``templates=``): ``slurm_run.sbatch``, ``slurm_array.sbatch`` and
  ``mpirun_local.sh``, with ``{{placeholders}}`` (a :class:`string.Template` whose delimiter
  is ``{{``, so that the shell's own ``$VAR`` and ``${VAR}`` need no escaping).

:func:`expand` turns a sweep into :class:`Task` s (overrides, output path, rank count, a stable
name built from the varying values); :func:`write_tasks_file` writes them one per line (the
``<name>.tasks`` file read by the array and workstation scripts); the ``render_*`` functions
return script text; :func:`render_all` writes everything for one sweep and one site.

Every function here is pure apart from :func:`render_all` and :func:`write_tasks_file` (and the
loaders, which read their file); nothing prints. Mistakes in a site or sweep file raise
:class:`~fednest_mpi.errors.UsageError` naming the file, the field and the fix.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
import shlex
import string
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fednest_mpi.config import flatten_config
from fednest_mpi.errors import UsageError
from fednest_mpi.text import did_you_mean

#: the templates and built-in sites, package data beside this module (declared in setup.cfg)
DEFAULT_TEMPLATES = Path(__file__).resolve().parent / "templates"
SITES_DIR = Path(__file__).resolve().parent / "sites"
TEMPLATE_RUN = "slurm_run.sbatch"
TEMPLATE_ARRAY = "slurm_array.sbatch"
TEMPLATE_LOCAL = "mpirun_local.sh"
TEMPLATES = (TEMPLATE_RUN, TEMPLATE_ARRAY, TEMPLATE_LOCAL)
LAUNCHERS = ("srun", "mpirun")
SCALING_KINDS = ("strong", "weak")

# ----------------------------------------------------------------------------------------------
# Small helpers


def _check_keys(where: str, data: Mapping, known: Sequence[str], what: str = "field") -> None:
    for key in data:
        if key not in known:
            raise UsageError(
                f"{where}{key}: unknown {what}" + did_you_mean(key, known) + f"; known: {', '.join(known)}"
            )


def _read_toml(path: str | Path, kind: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{kind} file {str(p)!r} does not exist; see jobs/{kind}s/ of the repository for examples")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{kind} file {str(p)!r} is not valid TOML: {exc}") from None


def _string(where: str, value: Any, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise UsageError(f"{where}: expected a {'non-empty ' if not empty else ''}string, got {value!r}")
    if "\n" in value or "\r" in value:
        raise UsageError(f"{where}: must be one line, got {value!r}")
    return value


def _strings(where: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise UsageError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(_string(f"{where}[{i}]", v, empty=False) for i, v in enumerate(value))


def _int(where: str, value: Any, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise UsageError(f"{where}: expected an integer, got {value!r}")
    if value < low:
        raise UsageError(f"{where}: must be >= {low}, got {value}")
    return value


def _word(where: str, value: Any) -> str:
    """A value that goes on an ``#SBATCH`` line: no spaces, quotes or newlines."""
    value = _string(where, value)
    if re.search(r"[\s'\"\\]", value):
        raise UsageError(f"{where}: {value!r} must not contain spaces, quotes or backslashes")
    return value


def _flatten(where: str, table: Any) -> dict[str, Any]:
    """``{"algorithm": {"name": [...]}}`` -> ``{"algorithm.name": [...]}`` (TOML dotted keys)."""
    if not isinstance(table, dict):
        raise UsageError(f"{where}: expected a table, got {table!r}")
    return flatten_config(table, hashable=False)  # lists stay lists: they are the swept values


def shell_expandable(text: str) -> str:
    """Double-quote ``text`` for bash, keeping ``$VAR``/``${VAR}`` expansion (a leading ``~`` becomes ``$HOME``)."""
    if text == "~" or text.startswith("~/"):
        text = "$HOME" + text[1:]
    return '"' + re.sub(r'(["\\`])', r"\\\1", text) + '"'


def toml_value(value: Any) -> str:
    """``value`` as a TOML literal, the form ``--set section.field=VALUE`` parses."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        out = []
        for ch in value:
            if ch in '"\\':
                out.append("\\" + ch)
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                out.append(f"\\u{ord(ch):04x}")
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise UsageError(f"cannot pass {value!r} as a config value; use a number, string, boolean or list")


def _label(value: Any) -> str:
    text = toml_value(value).strip('"') if not isinstance(value, str) else value
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-") or "x"


def parse_time(text: str) -> int:
    """SLURM time limit (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``) in seconds."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m:
        raise ValueError(text)
    days, a, b, c = m.groups()
    a, b, c = int(a), int(b) if b else None, int(c) if c else None
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:  # HH:MM:SS (c is set only with b)
        return a * 3600 + (b or 0) * 60 + c
    if b is not None:  # MM:SS
        return a * 60 + b
    return a * 60  # MM


# ----------------------------------------------------------------------------------------------
# Site


@dataclass(frozen=True)
class Site:
    """One machine: what a batch script needs that is not the run itself."""

    name: str = "site"
    account: str = ""  #: ``#SBATCH --account`` (omitted when empty)
    partition: str = ""  #: ``#SBATCH --partition``
    qos: str = ""  #: ``#SBATCH --qos``
    sbatch_extra: tuple[str, ...] = ()  #: more ``#SBATCH`` options, e.g. ``--constraint=cpu``
    setup: tuple[str, ...] = ()  #: shell lines run first, e.g. ``module purge``
    modules: tuple[str, ...] = ()  #: ``module load`` each, in order
    venv: str = ""  #: virtual environment to activate ($VARS expand at job time)
    env: Mapping[str, str] = field(default_factory=dict)  #: exported variables ($VARS expand)
    launcher: str = "srun"  #: srun | mpirun
    srun_flags: tuple[str, ...] = ()  #: e.g. ``--mpi=pmix``, ``--cpu-bind=cores``
    mpirun_command: str = "mpirun"  #: the mpirun launcher (mpirun, mpiexec, a path)
    mpirun_flags: tuple[str, ...] = ()  #: e.g. ``--bind-to core``
    command: tuple[str, ...] = ("fednest-mpi",)  #: how to call the simulator
    path: str = ""  #: the file it was read from

    def sbatch_lines(self) -> list[str]:
        lines = [
            f"#SBATCH --{key}={value}"
            for key, value in (("account", self.account), ("partition", self.partition), ("qos", self.qos))
            if value
        ]
        return lines + [f"#SBATCH {opt}" for opt in self.sbatch_extra]

    def setup_block(self) -> str:
        """Shell lines: setup, module loads, venv activation, exports."""
        lines = [f"# site {self.name}" + (f" ({self.path})" if self.path else "")]
        lines += list(self.setup)
        lines += [f"module load {shlex.quote(m)}" for m in self.modules]
        if self.venv:
            venv = shell_expandable(self.venv.rstrip("/") + "/bin/activate")
            lines.append("# shellcheck source=/dev/null")
            lines.append(
                f'source {venv} || {{ echo "cannot activate the virtual environment {self.venv}" >&2; exit 2; }}'
            )
        lines += [f"export {key}={shell_expandable(value)}" for key, value in self.env.items()]
        return "\n".join(lines)

    def launch_prefix(self, launcher: str | None = None) -> str:
        """``srun ...`` or ``mpirun ...`` up to, not including, the command; ranks are ``$RANKS``."""
        launcher = launcher or self.launcher
        if launcher == "srun":
            return " ".join(["srun", '-n "$RANKS"', *map(shlex.quote, self.srun_flags)])
        if launcher == "mpirun":
            return " ".join([shlex.quote(self.mpirun_command), '-n "$RANKS"', *map(shlex.quote, self.mpirun_flags)])
        raise UsageError(
            f"launcher: {launcher!r} is not one of {', '.join(LAUNCHERS)}" + did_you_mean(launcher, LAUNCHERS)
        )


_SITE_FIELDS = tuple(f.name for f in dataclasses.fields(Site) if f.name != "path")


def site_from_dict(data: Mapping, where: str = "site") -> Site:
    """Validate plain data (a parsed site TOML) into a :class:`Site`."""
    pre = f"{where}: "
    _check_keys(pre, data, _SITE_FIELDS, "site field")
    kw: dict[str, Any] = {}
    for key in ("name", "venv"):
        if key in data:
            kw[key] = _string(pre + key, data[key])
    for key in ("account", "partition", "qos"):
        if key in data:
            kw[key] = _word(pre + key, data[key])
    for key in ("setup", "modules", "srun_flags", "mpirun_flags"):
        if key in data:
            kw[key] = _strings(pre + key, data[key])
    if "sbatch_extra" in data:
        kw["sbatch_extra"] = _strings(pre + "sbatch_extra", data["sbatch_extra"])
        for i, opt in enumerate(kw["sbatch_extra"]):
            if not opt.startswith("-"):
                raise UsageError(
                    f"{pre}sbatch_extra[{i}]: {opt!r} is not an sbatch option; write it as '--constraint=cpu'"
                )
    if "mpirun_command" in data:
        kw["mpirun_command"] = _string(pre + "mpirun_command", data["mpirun_command"], empty=False)
    if "command" in data:
        cmd = data["command"]
        kw["command"] = (
            tuple(shlex.split(_string(pre + "command", cmd, empty=False)))
            if isinstance(cmd, str)
            else _strings(pre + "command", cmd)
        )
        if not kw["command"]:
            raise UsageError(f"{pre}command: must name a program, e.g. 'fednest-mpi'")
    if "launcher" in data:
        launcher = data["launcher"]
        if launcher not in LAUNCHERS:
            raise UsageError(
                f"{pre}launcher: {launcher!r} is not one of {', '.join(LAUNCHERS)}"
                + did_you_mean(str(launcher), LAUNCHERS)
            )
        kw["launcher"] = launcher
    if "env" in data:
        env = data["env"]
        if not isinstance(env, dict):
            raise UsageError(f"{pre}env: expected a table of NAME = value, got {env!r}")
        out = {}
        for key, value in env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise UsageError(f"{pre}env.{key}: not a valid environment variable name")
            if isinstance(value, (dict, list)):
                raise UsageError(f"{pre}env.{key}: expected a string or number, got {value!r}")
            out[key] = toml_value(value).strip('"') if not isinstance(value, str) else _string(f"{pre}env.{key}", value)
        kw["env"] = out
    return Site(**kw)


def builtin_sites() -> list[str]:
    """Names of the built-in sites (``local``, ``example-cluster``), in alphabetical order."""
    return sorted(p.stem for p in SITES_DIR.glob("*.toml"))


def site_path(site: str | Path) -> Path:
    """The file of ``site``: a built-in site's name (:func:`builtin_sites`) or the path of a site
    file. A name wins over a file of that name in the current directory (write ``./local`` for it)."""
    names = builtin_sites()
    if isinstance(site, str) and site in names:
        return SITES_DIR / f"{site}.toml"
    if not Path(site).is_file():
        builtin = ", ".join(names) or "none: the package was installed without its data"
        raise UsageError(
            f"site {str(site)!r} is neither a built-in site ({builtin}) nor an existing site file"
            + did_you_mean(str(site), names)
            + "; give one of those names or the path of a TOML site file"
        )
    return Path(site)


def load_site(site: str | Path) -> Site:
    """Read and validate a site: a built-in site's name or the path of a site file (:func:`site_path`)."""
    path = site_path(site)
    data = _read_toml(path, "site")
    loaded = site_from_dict(data, str(path))
    return dataclasses.replace(loaded, name=data.get("name", path.stem), path=str(path))


# ----------------------------------------------------------------------------------------------
# Sweep


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
    kw.update(set=fixed, grid=axes["grid"], zip=axes["zip"])
    if not isinstance(data.get("resources", {}), dict):
        raise UsageError(f"{pre}resources: expected a table, got {data['resources']!r}")
    kw["resources"] = resources_from_dict(data.get("resources", {}), f"{where}: resources")
    if "scaling" in data:
        sc = data["scaling"]
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
                raise UsageError(
                    f"{pre}scaling.per_rank.{key}: expected a number (the value for one rank), got {value!r}"
                )
        if kind == "weak" and not per_rank:
            raise UsageError(
                f"{pre}scaling.per_rank: weak scaling needs the fields that grow with the ranks, "
                "e.g. [scaling.per_rank] algorithm.clients_per_round = 10"
            )
        if kind == "strong" and per_rank:
            raise UsageError(
                f'{pre}scaling.per_rank: strong scaling keeps the problem fixed; drop per_rank or use kind = "weak"'
            )
        kw["scaling"] = Scaling(kind=kind, ranks=ranks, per_rank=per_rank)
    sweep = Sweep(**kw)
    varying = list(sweep.grid) + list(sweep.zip) + list(sweep.scaling.per_rank if sweep.scaling else ())
    for key in varying:
        if varying.count(key) > 1 or key in sweep.set:
            raise UsageError(f"{pre}{key}: given in more than one of set, grid, zip, scaling.per_rank; keep one")
    return sweep


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


# ----------------------------------------------------------------------------------------------
# Tasks


@dataclass(frozen=True)
class Task:
    """One run of a sweep."""

    index: int  #: position in the sweep (the array task id)
    name: str  #: stable, from the varying values, e.g. ``fednest_seed1``
    config: str  #: base config path
    overrides: tuple[str, ...]  #: ``section.field=<TOML value>``, for ``--set``
    output: str  #: HDF5 output path
    ranks: int  #: MPI ranks
    values: Mapping[str, Any] = field(default_factory=dict)  #: the varying values (and ranks)
    sweep: str = ""
    overwrite: bool = False

    @property
    def job_name(self) -> str:
        return f"{self.sweep}-{self.name}" if self.sweep else self.name

    def args(self) -> list[str]:
        """Arguments of ``fednest-mpi run CONFIG`` after the config."""
        out: list[str] = []
        for o in self.overrides:
            out += ["--set", o]
        out += ["--output", self.output]
        return out + (["--overwrite"] if self.overwrite else [])

    def command(self, program: Sequence[str] = ("fednest-mpi",)) -> list[str]:
        return [*program, "run", self.config, *self.args()]


def _values_label(key: str, values: Sequence) -> Callable[[Any], str]:
    if all(isinstance(v, str) for v in values):
        return _label
    short = key.rsplit(".", 1)[-1]
    return lambda v: short + _label(v)


def _format_name(pattern: str, values: Mapping[str, Any], where: str) -> str:
    def sub(m):
        key = m.group(1)
        if key not in values:
            raise UsageError(
                f"{where}name_pattern: {{{key}}} is not a value of the sweep"
                + did_you_mean(key, values)
                + f"; known: {', '.join(values)}"
            )
        return _label(values[key])

    return _label(re.sub(r"\{([^{}]*)\}", sub, pattern))


def expand(sweep: Sweep) -> list[Task]:
    """All runs of ``sweep`` in a deterministic order: rank counts (scaling), then the grid in
    file order (the first field varies slowest), then the zip lists."""
    where = f"{sweep.path or sweep.name}: "
    grid_keys, zip_keys = list(sweep.grid), list(sweep.zip)
    zip_rows = list(zip(*sweep.zip.values())) if sweep.zip else [()]
    rank_list = sweep.scaling.ranks if sweep.scaling else (sweep.resources.ranks,)
    width = len(str(max(rank_list)))
    labels = {k: _values_label(k, v) for k, v in {**sweep.grid, **sweep.zip}.items()}
    tasks: list[Task] = []
    for ranks in rank_list:
        for combo in itertools.product(*sweep.grid.values(), zip_rows):
            varying = dict(zip(grid_keys, combo[:-1])) | dict(zip(zip_keys, combo[-1]))
            derived = {}
            if sweep.scaling and sweep.scaling.kind == "weak":
                derived = {k: v * ranks for k, v in sweep.scaling.per_rank.items()}
            index = len(tasks)
            values = {**sweep.set, **varying, **derived}
            if sweep.scaling:
                values["ranks"] = ranks
            if sweep.name_pattern:
                name = _format_name(sweep.name_pattern, {**values, "index": index, "sweep": sweep.name}, where)
            else:
                parts = [f"ranks{ranks:0{width}d}"] if sweep.scaling else []
                parts += [labels[k](v) for k, v in varying.items()]
                name = "_".join(parts) or sweep.name
            overrides = tuple(f"{k}={toml_value(v)}" for k, v in {**sweep.set, **varying, **derived}.items())
            output = str(Path(sweep.output_dir) / f"{name}.h5") if sweep.output_dir else f"{name}.h5"
            tasks.append(
                Task(
                    index=index,
                    name=name,
                    config=sweep.config,
                    overrides=overrides,
                    output=output,
                    ranks=ranks,
                    values={**varying, **derived, **({"ranks": ranks} if sweep.scaling else {})},
                    sweep=sweep.name,
                    overwrite=sweep.overwrite,
                )
            )
    seen: dict[str, Task] = {}
    for t in tasks:
        if t.name in seen:
            raise UsageError(
                f"{where}tasks {seen[t.name].index} and {t.index} are both named {t.name!r}; "
                "add the fields that tell them apart to name_pattern"
            )
        seen[t.name] = t
    return tasks


def check_tasks(tasks: Sequence[Task], workdir: str | Path = ".") -> None:
    """Validate every task's config as ``fednest-mpi run`` would (field names, values, ranks
    against clients), with paths relative to ``workdir``: a typo fails here, not in the queue."""
    from fednest_mpi import config as configuration

    for t in tasks:
        path = Path(t.config)
        if not path.is_absolute():
            path = Path(workdir) / path
        try:
            cfg = configuration.load(path, list(t.overrides))
            configuration.validate_world(cfg, t.ranks)
        except UsageError as exc:
            raise UsageError(f"task {t.index} ({t.name}): {exc}") from None


def task_line(task: Task) -> str:
    """One line of a tasks file: ``NAME RANKS ARGS...``, shell-quoted (read back with ``eval set --``)."""
    return shlex.join([task.name, str(task.ranks), *task.args()])


def write_tasks_file(tasks: Sequence[Task], path: str | Path) -> Path:
    """Write the tasks file: line ``i`` (0-based: the array task id) is task ``i`` as
    ``NAME RANKS --set F=V ... --output PATH``, every word shell-quoted. No header, no comments."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(task_line(t) + "\n" for t in tasks))
    return p


def describe(tasks: Sequence[Task]) -> str:
    """A text table of the tasks: id, name, ranks, output, overrides."""
    rows = [("id", "name", "ranks", "output", "overrides")]
    rows += [(str(t.index), t.name, str(t.ranks), t.output, " ".join(t.overrides)) for t in tasks]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] + "\n" for r in rows)


# ----------------------------------------------------------------------------------------------
# Templates


# the {{name}} placeholder of ScriptTemplate (string.Template syntax, re.VERBOSE)
_PLACEHOLDER = r"""
        \{\{(?:
          (?P<escaped>(?!)) |
          \s*(?P<braced>[a-z_][a-z0-9_]*)\s*\}\} |
          (?P<named>(?!)) |
          (?P<invalid>)
        )
    """


class ScriptTemplate(string.Template):
    """``{{name}}`` placeholders; ``$`` is left alone for the shell. A placeholder alone on a line
    whose value is empty removes the line."""

    delimiter = "{{"
    pattern = _PLACEHOLDER  # type: ignore[assignment]  # a str: string.Template compiles it

    def render(self, values: Mapping[str, Any], where: str = "template") -> str:
        missing = [k for k in self.get_identifiers() if k not in values]
        if missing:
            raise UsageError(f"{where}: no value for {{{{{missing[0]}}}}}; known: {', '.join(values)}")
        text = re.sub(
            r"^[ \t]*\{\{\s*([a-z_][a-z0-9_]*)\s*\}\}[ \t]*\n",
            lambda m: "" if str(values[m.group(1)]) == "" else m.group(0),
            self.template,
            flags=re.M,
        )
        try:
            return type(self)(text).substitute({k: str(v) for k, v in values.items()})
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}") from None


def load_template(name: str, templates: str | Path | None = None) -> ScriptTemplate:
    directory = Path(templates) if templates else DEFAULT_TEMPLATES
    path = directory / name
    if not path.is_file():
        fix = (
            f"a templates folder holds {', '.join(TEMPLATES)}"
            if templates
            else "the package was installed without its data; reinstall fednest-mpi"
        )
        raise UsageError(f"template {str(path)!r} does not exist; {fix}")
    return ScriptTemplate(path.read_text())


def _abs(path: str | Path) -> str:
    return os.path.abspath(os.path.expanduser(str(path)))


def _common(site: Site, resources: Resources, workdir, log_dir, launcher) -> dict[str, Any]:
    if re.search(r"[\s'\"\\%]", _abs(log_dir)):
        raise UsageError(
            f"log directory {_abs(log_dir)!r}: #SBATCH --output cannot take spaces, quotes or '%' in a path; "
            "render into a directory without them"
        )
    return {
        "nodes": resources.nodes,
        "tasks_per_node": resources.tasks_per_node,
        "cpus_per_task": resources.cpus_per_task,
        "gpus_line": f"#SBATCH --gpus-per-node={resources.gpus_per_node}" if resources.gpus_per_node else "",
        "time": resources.time,
        "signal_line": f"#SBATCH --signal=B:USR1@{resources.signal_seconds}" if resources.signal_seconds else "",
        "signal_seconds": resources.signal_seconds,
        "max_restarts": resources.max_restarts,
        "site_sbatch": "\n".join(site.sbatch_lines()),
        "site_setup": site.setup_block(),
        "workdir": shlex.quote(_abs(workdir)),
        "log_dir": _abs(log_dir),
        "launch": site.launch_prefix(launcher),
        "command": shlex.join(site.command),
        "mpirun_command": shlex.quote(site.mpirun_command),
    }


def render_run(
    site: Site,
    task: Task,
    resources: Resources,
    *,
    workdir: str | Path = ".",
    log_dir: str | Path = "logs",
    launcher: str | None = None,
    templates: str | Path | None = None,
) -> str:
    """The SLURM batch script of one run (``slurm_run.sbatch``)."""
    values = _common(site, resources, workdir, log_dir, launcher)
    values.update(
        job_name=_label(task.job_name),
        config=shlex.quote(task.config),
        ranks=task.ranks,
        args=shlex.join(task.args()),
        task_name=task.name,
    )
    return load_template(TEMPLATE_RUN, templates).render(values, TEMPLATE_RUN)


def _array_resources(sweep: Sweep, tasks: Sequence[Task]) -> Resources:
    """One allocation that holds the largest task of the sweep."""
    return sweep.resources.for_ranks(max(t.ranks for t in tasks)) if sweep.scaling else sweep.resources


def render_array(
    site: Site,
    sweep: Sweep,
    tasks_file: str | Path,
    *,
    workdir: str | Path = ".",
    log_dir: str | Path = "logs",
    launcher: str | None = None,
    templates: str | Path | None = None,
) -> str:
    """The SLURM job array over the sweep (``slurm_array.sbatch``): task ``i`` runs line ``i`` of ``tasks_file``."""
    tasks = expand(sweep)
    resources = _array_resources(sweep, tasks)
    values = _common(site, resources, workdir, log_dir, launcher)
    throttle = f"%{resources.max_parallel}" if resources.max_parallel else ""
    values.update(
        job_name=sweep.name,
        n_tasks=len(tasks),
        array=f"0-{len(tasks) - 1}{throttle}",
        config=shlex.quote(sweep.config),
        tasks_file=shlex.quote(_abs(tasks_file)),
    )
    return load_template(TEMPLATE_ARRAY, templates).render(values, TEMPLATE_ARRAY)


def render_local(
    site: Site,
    sweep: Sweep,
    tasks_file: str | Path,
    *,
    workdir: str | Path = ".",
    log_dir: str | Path = "logs",
    templates: str | Path | None = None,
) -> str:
    """The workstation script (``mpirun_local.sh``): the sweep's tasks through ``mpiexec -n RANKS``,
    one at a time or ``-j N`` at once."""
    tasks = expand(sweep)
    values = _common(site, sweep.resources, workdir, log_dir, "mpirun")
    values.update(
        job_name=sweep.name,
        n_tasks=len(tasks),
        config=shlex.quote(sweep.config),
        tasks_file=shlex.quote(_abs(tasks_file)),
        log_dir=shlex.quote(_abs(log_dir)),
    )
    return load_template(TEMPLATE_LOCAL, templates).render(values, TEMPLATE_LOCAL)


def render_all(
    sweep_path: str | Path,
    site: str | Path,
    out_dir: str | Path | None = None,
    *,
    workdir: str | Path | None = None,
    launcher: str | None = None,
    check: bool = True,
    templates: str | Path | None = None,
    preset: str = "",
) -> list[Path]:
    """Write everything for one sweep (with ``preset``: that preset of it, :func:`apply_preset`) on one
    site (a built-in site's name or a site file) into ``out_dir`` and return the paths:

    * ``NAME.tasks`` -- one line per run (:func:`write_tasks_file`),
    * ``NAME.array.sbatch`` -- the job array (``sbatch out_dir/NAME.array.sbatch``),
    * ``NAME.local.sh`` -- the workstation script (``bash out_dir/NAME.local.sh [-j N] [ID ...]``),
    * ``run/TASK.sbatch`` -- one batch script per run (for scaling studies: each its own allocation),
    * ``logs/`` -- the (empty) log directory, which SLURM needs to exist at submission.

    ``out_dir`` defaults to ``WORKDIR/runs/jobs/NAME`` (``runs/`` is git-ignored).

    Config and output paths of the sweep are relative to ``workdir`` (default: the current
    directory), where every script changes directory first. With ``check`` every task's config
    is validated first, so a typo in a field name is reported here and nothing is written.
    """
    sweep, machine = load_sweep(sweep_path, preset), load_site(site)
    if launcher is not None and launcher not in LAUNCHERS:
        raise UsageError(
            f"launcher: {launcher!r} is not one of {', '.join(LAUNCHERS)}" + did_you_mean(launcher, LAUNCHERS)
        )
    workdir = Path(workdir if workdir is not None else os.getcwd())
    tasks = expand(sweep)
    if check:
        check_tasks(tasks, workdir)
    out = Path(out_dir) if out_dir is not None else workdir / "runs" / "jobs" / sweep.name
    log_dir, tasks_file = out / "logs", out / f"{sweep.name}.tasks"
    common: dict[str, Any] = dict(workdir=workdir, log_dir=log_dir, templates=templates)
    scripts = {  # rendered first: nothing is written when a template or a value is wrong
        out / f"{sweep.name}.array.sbatch": render_array(machine, sweep, tasks_file, launcher=launcher, **common),
        out / f"{sweep.name}.local.sh": render_local(machine, sweep, tasks_file, **common),
    }
    for t in tasks:
        res = sweep.resources.for_ranks(t.ranks) if sweep.scaling else sweep.resources
        scripts[out / "run" / f"{t.name}.sbatch"] = render_run(machine, t, res, launcher=launcher, **common)
    log_dir.mkdir(parents=True, exist_ok=True)
    (out / "run").mkdir(exist_ok=True)
    written = [write_tasks_file(tasks, tasks_file)]
    for path, text in scripts.items():
        path.write_text(text)
        path.chmod(0o755)
        written.append(path)
    return written
