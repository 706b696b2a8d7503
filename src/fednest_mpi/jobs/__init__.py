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

One module a job: :mod:`.values` (checks of the files' values), :mod:`.site`, :mod:`.sweep`, :mod:`.tasks`
and :mod:`.render`; their public names are importable from here.

Every function here is pure apart from :func:`render_all` and :func:`write_tasks_file` (and the
loaders, which read their file); nothing prints. Mistakes in a site or sweep file raise
:class:`~fednest_mpi.errors.UsageError` naming the file, the field and the fix.
"""

from fednest_mpi.jobs.render import (
    DEFAULT_TEMPLATES,
    TEMPLATE_ARRAY,
    TEMPLATE_LOCAL,
    TEMPLATE_RUN,
    TEMPLATES,
    ScriptTemplate,
    load_template,
    render_all,
    render_array,
    render_local,
    render_run,
)
from fednest_mpi.jobs.site import LAUNCHERS, SITES_DIR, Site, builtin_sites, load_site, site_from_dict, site_path
from fednest_mpi.jobs.sweep import (
    SCALING_KINDS,
    Resources,
    Scaling,
    Sweep,
    apply_preset,
    default_signal_seconds,
    load_sweep,
    resources_from_dict,
    sweep_from_dict,
)
from fednest_mpi.jobs.tasks import Task, check_tasks, describe, expand, task_line, write_tasks_file
from fednest_mpi.jobs.values import parse_time, shell_expandable, toml_value

__all__ = [
    "DEFAULT_TEMPLATES",
    "LAUNCHERS",
    "Resources",
    "SCALING_KINDS",
    "SITES_DIR",
    "Scaling",
    "ScriptTemplate",
    "Site",
    "Sweep",
    "TEMPLATES",
    "TEMPLATE_ARRAY",
    "TEMPLATE_LOCAL",
    "TEMPLATE_RUN",
    "Task",
    "apply_preset",
    "builtin_sites",
    "check_tasks",
    "default_signal_seconds",
    "describe",
    "expand",
    "load_site",
    "load_sweep",
    "load_template",
    "parse_time",
    "render_all",
    "render_array",
    "render_local",
    "render_run",
    "resources_from_dict",
    "shell_expandable",
    "site_from_dict",
    "site_path",
    "sweep_from_dict",
    "task_line",
    "toml_value",
    "write_tasks_file",
]
