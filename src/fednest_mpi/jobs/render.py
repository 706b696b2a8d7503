"""The script templates (``{{placeholder}}``, :class:`ScriptTemplate`) and the scripts of one sweep on one site."""

from __future__ import annotations

import os
import re
import shlex
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fednest_mpi.errors import UsageError
from fednest_mpi.jobs.site import LAUNCHERS, Site, load_site
from fednest_mpi.jobs.sweep import Resources, Sweep, load_sweep
from fednest_mpi.jobs.tasks import Task, check_tasks, expand, write_tasks_file
from fednest_mpi.jobs.values import _label
from fednest_mpi.text import did_you_mean

#: the templates, package data beside this module (declared in setup.cfg)
DEFAULT_TEMPLATES = Path(__file__).resolve().parent / "templates"
TEMPLATE_RUN = "slurm_run.sbatch"
TEMPLATE_ARRAY = "slurm_array.sbatch"
TEMPLATE_LOCAL = "mpirun_local.sh"
TEMPLATES = (TEMPLATE_RUN, TEMPLATE_ARRAY, TEMPLATE_LOCAL)

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
    if out_dir is not None and os.fspath(out_dir) == "":  # Path("") would be the current folder
        raise UsageError("--out-dir: the path is empty; give a folder, such as runs/jobs/" + sweep.name)
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
