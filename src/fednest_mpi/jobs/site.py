"""A **site** file: everything that belongs to one machine (account, partition, QOS, modules, virtual
environment, MPI launcher and its flags, extra environment); the built-in sites are package data in
``sites/`` beside this module, named by their stem."""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fednest_mpi.errors import UsageError
from fednest_mpi.jobs.values import _check_keys, _read_toml, _string, _strings, _word, shell_expandable, toml_value
from fednest_mpi.text import did_you_mean

#: the built-in sites, package data beside this module (declared in setup.cfg)
SITES_DIR = Path(__file__).resolve().parent / "sites"
LAUNCHERS = ("srun", "mpirun")


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
        kw["sbatch_extra"] = _sbatch_extra(pre, data["sbatch_extra"])
    if "mpirun_command" in data:
        kw["mpirun_command"] = _string(pre + "mpirun_command", data["mpirun_command"], empty=False)
    if "command" in data:
        kw["command"] = _command(pre, data["command"])
    if "launcher" in data:
        kw["launcher"] = _launcher(pre, data["launcher"])
    if "env" in data:
        kw["env"] = _environment(pre, data["env"])
    return Site(**kw)


def _sbatch_extra(pre: str, value) -> tuple[str, ...]:
    """The site's extra sbatch options: strings, each an option (``--constraint=cpu``)."""
    options = _strings(pre + "sbatch_extra", value)
    for i, opt in enumerate(options):
        if not opt.startswith("-"):
            raise UsageError(f"{pre}sbatch_extra[{i}]: {opt!r} is not an sbatch option; write it as '--constraint=cpu'")
    return options


def _command(pre: str, cmd) -> tuple[str, ...]:
    """The site's command: a shell-like string or a list of words, naming a program."""
    words = (
        tuple(shlex.split(_string(pre + "command", cmd, empty=False)))
        if isinstance(cmd, str)
        else _strings(pre + "command", cmd)
    )
    if not words:
        raise UsageError(f"{pre}command: must name a program, e.g. 'fednest-mpi'")
    return words


def _launcher(pre: str, launcher) -> str:
    if launcher not in LAUNCHERS:
        raise UsageError(
            f"{pre}launcher: {launcher!r} is not one of {', '.join(LAUNCHERS)}" + did_you_mean(str(launcher), LAUNCHERS)
        )
    return launcher


def _environment(pre: str, env) -> dict[str, str]:
    """The site's environment table: valid names, string or number values (as the shell gets them)."""
    if not isinstance(env, dict):
        raise UsageError(f"{pre}env: expected a table of NAME = value, got {env!r}")
    out = {}
    for key, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"{pre}env.{key}: not a valid environment variable name")
        if isinstance(value, (dict, list)):
            raise UsageError(f"{pre}env.{key}: expected a string or number, got {value!r}")
        out[key] = toml_value(value).strip('"') if not isinstance(value, str) else _string(f"{pre}env.{key}", value)
    return out


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
