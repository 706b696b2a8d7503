"""Batch jobs (fednest_mpi.jobs, jobs/): sites, sweeps, task expansion, rendered scripts.

The SLURM scripts are executed for real with a stand-in ``srun`` (translates ``srun -n N ...``
into ``mpiexec -n N ...``) and stand-in ``module``/``scontrol``; the ``#SBATCH`` lines are
comments to bash. MPI runs use at most 2 ranks and a tiny config.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from fednest_mpi import jobs
from fednest_mpi.config import parse_override
from fednest_mpi.errors import UsageError
from fednest_mpi.io.h5 import read_run

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MPIEXEC = BIN / "mpiexec"
SITES = {name: jobs.SITES_DIR / f"{name}.toml" for name in ("example-cluster", "local")}
SWEEPS = ROOT / "jobs" / "sweeps"
TINY = {"algorithm.outer_iterations": 2, "problem.n_clients": 8, "algorithm.clients_per_round": 4}
VARIANTS = ["fednest", "fednest_sgd", "lfednest", "lfednest_svrg", "lfednest_nonalt"]


def needs_mpi(test):
    """A test whose script starts mpiexec (through the stand-in srun): marked ``processes``, skipped without it."""
    skip = pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec beside {sys.executable}")
    return pytest.mark.processes(skip(test))


FAKE_SRUN = f"""#!/bin/bash
# stand-in for srun: srun [-n N | --ntasks=N] [--any-flag[=value] ...] CMD ARGS -> mpiexec -n N CMD ARGS
n=1
while [ $# -gt 0 ]; do
    case $1 in
        -n|--ntasks) n=$2; shift 2 ;;
        -n*) n=${{1#-n}}; shift ;;
        --ntasks=*) n=${{1#*=}}; shift ;;
        -*) shift ;;
        *) break ;;
    esac
done
echo "srun: $n ranks: $*" >> "$FAKE_LOG"
exec {shlex.quote(str(MPIEXEC))} -n "$n" "$@"
"""

# srun that only records its arguments and any USR1 it gets, and runs until told
FAKE_SRUN_SLEEPY = """#!/bin/bash
echo "srun $*" >> "$FAKE_LOG"
trap 'echo "srun got USR1" >> "$FAKE_LOG"; exit 0' USR1
touch "$FAKE_LOG.started"
for _ in $(seq "${FAKE_SLEEP_STEPS:-0}"); do sleep 0.05; done
exit 0
"""


def _write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def fakebin(tmp_path):
    """A bin folder with stand-ins for srun, module and scontrol; returns (env, log path)."""
    b = tmp_path / "fakebin"
    b.mkdir()
    log = tmp_path / "fake.log"
    _write_exe(b / "srun", FAKE_SRUN)
    _write_exe(b / "module", '#!/bin/bash\necho "module $*" >> "$FAKE_LOG"\n')
    _write_exe(b / "scontrol", '#!/bin/bash\necho "scontrol $*" >> "$FAKE_LOG"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "OMPI_", "VIRTUAL_ENV"))}
    env.update(
        PATH=f"{b}:{BIN}:{env.get('PATH', '')}", FAKE_LOG=str(log), MPI4PY_RC_THREAD_LEVEL="single", HOME=str(tmp_path)
    )
    return b, env, log


def write_sweep(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def tiny_sweep(tmp_path, grid: str, *, tasks_per_node=2, extra="") -> Path:
    sets = "\n".join(f"{k} = {v}" for k, v in TINY.items())
    return write_sweep(
        tmp_path / "tiny.toml",
        f"""
config = "{ROOT / "configs" / "quadratic.toml"}"
output_dir = "out"
{extra}
[set]
{sets}
[grid]
{grid}
[resources]
tasks_per_node = {tasks_per_node}
time = "00:05:00"
signal_seconds = 60
""",
    )


def sbatch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


# ----------------------------------------------------------------------------------------------
# Sites


def test_shipped_sites_load():
    cluster, local = jobs.load_site(SITES["example-cluster"]), jobs.load_site(SITES["local"])
    assert cluster.name == "example-cluster" and cluster.launcher == "srun" and "--mpi=pmix" in cluster.srun_flags
    assert cluster.account and cluster.partition and cluster.qos and cluster.modules and cluster.venv
    assert local.launcher == "mpirun" and local.mpirun_command == "mpiexec" and not local.account


def test_bad_site_key_names_the_field_and_suggests(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('accout = "p1"\npartition = "cpu"\n')
    with pytest.raises(UsageError, match=r"accout: unknown site field \(did you mean 'account'\?\)"):
        jobs.load_site(bad)
    bad.write_text('launcher = "sruun"\n')
    with pytest.raises(UsageError, match=r"launcher: 'sruun' is not one of srun, mpirun \(did you mean 'srun'\?\)"):
        jobs.load_site(bad)
    bad.write_text('modules = "gcc"\naccount = "a b"\n')
    with pytest.raises(UsageError, match="account: 'a b' must not contain spaces"):
        jobs.load_site(bad)
    with pytest.raises(UsageError, match="neither a built-in site .* nor an existing site file"):
        jobs.load_site(tmp_path / "missing.toml")


def test_sites_are_named_by_their_builtin_name_or_given_by_path(tmp_path, monkeypatch):
    assert jobs.builtin_sites() == ["example-cluster", "local"]
    for name in jobs.builtin_sites():
        site = jobs.load_site(name)
        assert site.name == name and Path(site.path) == SITES[name] and site == jobs.load_site(SITES[name])
    # a name wins over a file of that name in the current directory; ./NAME reads the file
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local").write_text('name = "mine"\nlauncher = "srun"\n')
    assert jobs.load_site("local").launcher == "mpirun" and jobs.load_site("./local").name == "mine"
    with pytest.raises(UsageError) as err:
        jobs.load_site("lcoal")
    assert str(err.value) == (
        "site 'lcoal' is neither a built-in site (example-cluster, local) nor an existing site file "
        "(did you mean 'local'?); give one of those names or the path of a TOML site file"
    )


def test_render_help_names_every_builtin_site(capsys):
    from fednest_mpi.cli import main

    with pytest.raises(SystemExit):
        main(["jobs", "render", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: local)" in text and all(name in text for name in jobs.builtin_sites())


# ----------------------------------------------------------------------------------------------
# Sweeps and tasks


def test_quadratic_variants_expand_to_15_distinct_runs():
    sweep = jobs.load_sweep(SWEEPS / "quadratic_variants.toml")
    tasks = jobs.expand(sweep)
    assert len(tasks) == 15
    assert len({t.name for t in tasks}) == 15 and len({t.output for t in tasks}) == 15
    assert [t.index for t in tasks] == list(range(15))
    assert tasks[0].name == "fednest_seed0" and tasks[1].name == "fednest_seed1"
    assert {(t.values["algorithm.name"], t.values["seed"]) for t in tasks} == {
        (a, s) for a in VARIANTS for s in (0, 1, 2)
    }
    assert all(t.config == "configs/quadratic.toml" and t.output.startswith("runs/quadratic_variants/") for t in tasks)
    assert 'algorithm.name="lfednest_svrg"' in tasks[9].overrides
    assert jobs.expand(sweep) == tasks  # deterministic
    jobs.check_tasks(tasks, ROOT)  # every task is a valid config


def test_default_names_grid_zip_order_and_fixed_values(tmp_path):
    path = write_sweep(
        tmp_path / "s.toml",
        """
config = "configs/quadratic.toml"
[set]
problem.heterogeneity = 0.5
[grid]
algorithm.name = ["fednest", "lfednest"]
seed = [0, 1]
[zip]
algorithm.inner_lr = [0.05, 0.1]
algorithm.outer_lr = [0.2, 0.4]
""",
    )
    tasks = jobs.expand(jobs.load_sweep(path))
    assert len(tasks) == 8
    assert tasks[0].name == "fednest_seed0_inner_lr0.05_outer_lr0.2"
    assert tasks[1].name == "fednest_seed0_inner_lr0.1_outer_lr0.4"
    assert tasks[-1].name == "lfednest_seed1_inner_lr0.1_outer_lr0.4"
    assert tasks[0].overrides == (
        "problem.heterogeneity=0.5",
        'algorithm.name="fednest"',
        "seed=0",
        "algorithm.inner_lr=0.05",
        "algorithm.outer_lr=0.2",
    )
    assert tasks[0].output == "runs/fednest_seed0_inner_lr0.05_outer_lr0.2.h5"
    jobs.check_tasks(tasks, ROOT)


def test_weak_scaling_multiplies_the_per_rank_fields():
    tasks = jobs.expand(jobs.load_sweep(SWEEPS / "weak_scaling.toml"))
    assert [t.ranks for t in tasks] == [1, 2, 4, 8, 16]
    assert [t.name for t in tasks] == ["ranks01", "ranks02", "ranks04", "ranks08", "ranks16"]
    for t in tasks:
        assert t.values["algorithm.clients_per_round"] == 10 * t.ranks
        assert t.values["problem.n_clients"] == 100 * t.ranks
        assert f"algorithm.clients_per_round={10 * t.ranks}" in t.overrides
    jobs.check_tasks(tasks, ROOT)


def test_strong_scaling_keeps_the_problem_and_sizes_the_allocation():
    sweep = jobs.load_sweep(SWEEPS / "strong_scaling.toml")
    tasks = jobs.expand(sweep)
    assert [t.ranks for t in tasks] == [1, 2, 4, 8, 16]
    assert len({t.overrides for t in tasks}) == 1 and len({t.output for t in tasks}) == 5
    assert sweep.resources.for_ranks(16) == dataclasses.replace(sweep.resources, nodes=2, tasks_per_node=8)
    assert sweep.resources.for_ranks(2) == dataclasses.replace(sweep.resources, nodes=1, tasks_per_node=2)
    jobs.check_tasks(tasks, ROOT)


@pytest.mark.parametrize(
    "body,message",
    [
        ("[grid]\nseed = []", r"grid.seed: expected a non-empty list"),
        ("[zip]\nseed = [1, 2]\nalgorithm.inner_lr = [0.1]", r"zip: the lists must have the same length"),
        ("[grid]\nseed = [1]\n[set]\nseed = 2", r"seed: given in more than one of set, grid"),
        ('[set]\nrun.output = "x.h5"', r"run.output: set by the sweep itself"),
        (
            'name_pattern = "{algorithm.name}"\n[grid]\nseed = [1, 2]',
            r"name_pattern: \{algorithm.name\} is not a value",
        ),
        ('name_pattern = "run"\n[grid]\nseed = [1, 2]', r"tasks 0 and 1 are both named 'run'"),
        (
            "[resources]\ntasks_per_nodes = 2",
            r"resources.tasks_per_nodes: unknown field \(did you mean 'tasks_per_node'\?\)",
        ),
        (
            '[resources]\ntime = "00:01:00"\nsignal_seconds = 60',
            r"signal_seconds: 60 s is not less than the time limit",
        ),
        ('[resources]\ntime = "soon"', r"time: 'soon' is not a SLURM time limit"),
        ('[scaling]\nkind = "weak"\nranks = [1, 2]', r"weak scaling needs the fields that grow"),
        (
            '[scaling]\nkind = "strongg"\nranks = [1]',
            r"scaling.kind: 'strongg' is not one of strong, weak \(did you mean 'strong'\?\)",
        ),
        ("gird = 1", r"gird: unknown field \(did you mean 'grid'\?\)"),
    ],
)
def test_sweep_mistakes_are_usage_errors(tmp_path, body, message):
    path = write_sweep(tmp_path / "s.toml", 'config = "configs/quadratic.toml"\n' + body + "\n")
    with pytest.raises(UsageError, match=message):
        jobs.expand(jobs.load_sweep(path))


def test_config_mistakes_in_a_sweep_are_caught_before_writing(tmp_path):
    grid = "[grid]\nalgorithm.outer_lrr = [0.1, 0.2]"
    path = write_sweep(tmp_path / "s.toml", f'config = "{ROOT / "configs" / "quadratic.toml"}"\n{grid}\n')
    with pytest.raises(
        UsageError, match=r"task 0 \(outer_lrr0.1\): algorithm.outer_lrr: unknown field \(did you mean 'outer_lr'\?\)"
    ):
        jobs.render_all(path, SITES["local"], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    path.write_text(f'config = "{ROOT / "configs" / "quadratic.toml"}"\n[scaling]\nkind = "strong"\nranks = [1, 64]\n')
    with pytest.raises(UsageError, match=r"task 1 \(ranks64\): problem.n_clients: 20 clients cannot fill 64 MPI ranks"):
        jobs.render_all(path, SITES["local"], tmp_path / "out")


def test_an_empty_out_dir_is_refused_not_read_as_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"--out-dir: the path is empty; give a folder, such as runs/jobs/fig4"):
        jobs.render_all(SWEEPS / "fig4.toml", SITES["local"], "", workdir=ROOT)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "value",
    [
        0,
        -3,
        2.5,
        1e-05,
        True,
        "lfednest",
        'it\'s a "quoted" $HOME `x` \\ ok',
        "é ✓",
        "tab\tnew\nline",
        [1, 2],
        ["a", "b"],
    ],
)
def test_values_survive_toml_and_shell_quoting(value):
    assert tomllib.loads("v = " + jobs.toml_value(value))["v"] == value
    task = jobs.Task(
        index=0, name="t", config="c.toml", overrides=(f"sec.field={jobs.toml_value(value)}",), output="o.h5", ranks=1
    )
    # the line as the scripts read it: eval "set -- $line", then one argument per line
    out = subprocess.run(
        ["bash", "-c", 'eval "set -- $1"; printf "%s\\0" "$@"', "bash", jobs.task_line(task)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")[:-1]
    assert out[:4] == ["t", "1", "--set", f"sec.field={jobs.toml_value(value)}"] and out[4:] == ["--output", "o.h5"]
    assert parse_override(out[3]) == (["sec", "field"], value)


def test_tasks_file_has_one_line_per_task(tmp_path):
    tasks = jobs.expand(jobs.load_sweep(SWEEPS / "quadratic_variants.toml"))
    path = jobs.write_tasks_file(tasks, tmp_path / "sub" / "v.tasks")
    lines = path.read_text().splitlines()
    assert len(lines) == 15
    assert shlex.split(lines[6])[:2] == ["lfednest_seed0", "4"]
    assert shlex.split(lines[6])[-2:] == ["--output", "runs/quadratic_variants/lfednest_seed0.h5"]
    assert "'algorithm.name=\"lfednest\"'" in lines[6]


# ----------------------------------------------------------------------------------------------
# Rendering


@pytest.mark.parametrize("site", sorted(SITES))
@pytest.mark.parametrize("sweep", ["quadratic_variants", "strong_scaling", "weak_scaling"])
def test_render_all_writes_scripts_that_bash_accepts(tmp_path, site, sweep):
    paths = jobs.render_all(SWEEPS / f"{sweep}.toml", SITES[site], tmp_path, workdir=ROOT)
    n = len(jobs.expand(jobs.load_sweep(SWEEPS / f"{sweep}.toml")))
    names = {p.name for p in paths}
    assert {f"{sweep}.tasks", f"{sweep}.array.sbatch", f"{sweep}.local.sh"} <= names and len(paths) == 3 + n
    assert (tmp_path / "logs").is_dir()
    for p in paths:
        if p.suffix == ".tasks":
            continue
        text = p.read_text()
        assert "{{" not in text and "}}" not in text, p
        assert text.startswith("#!"), p
        res = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
        assert res.returncode == 0, (p, res.stderr)


def test_site_specifics_come_from_the_site_file_only(tmp_path):
    site = jobs.load_site(SITES["example-cluster"])
    sweep = jobs.load_sweep(SWEEPS / "quadratic_variants.toml")
    text = jobs.render_array(site, sweep, tmp_path / "v.tasks", workdir=ROOT, log_dir=tmp_path / "logs")
    lines = sbatch_lines(text)
    assert (
        "#SBATCH --account=project123" in lines
        and "#SBATCH --partition=cpu" in lines
        and "#SBATCH --qos=normal" in lines
    )
    assert "module load openmpi/4.1.5" in text and 'source "$HOME/fednest-mpi/.venv/bin/activate"' in text
    assert 'export MPI4PY_RC_THREAD_LEVEL="single"' in text
    assert re.search(r"^srun -n \"\$RANKS\" --mpi=pmix --cpu-bind=cores fednest-mpi run ", text, re.M)
    local = jobs.render_array(jobs.load_site(SITES["local"]), sweep, tmp_path / "v.tasks")
    assert (
        "--account" not in local
        and "module" not in local
        and re.search(r"^mpiexec -n \"\$RANKS\" fednest-mpi run", local, re.M)
    )
    # the launcher can be chosen at render time
    assert re.search(
        r"^mpirun -n \"\$RANKS\" --bind-to core fednest-mpi",
        jobs.render_array(site, sweep, "t", launcher="mpirun"),
        re.M,
    )
    for name in (jobs.TEMPLATE_RUN, jobs.TEMPLATE_ARRAY, jobs.TEMPLATE_LOCAL):
        template = (jobs.DEFAULT_TEMPLATES / name).read_text()
        assert not re.search(r"project123|pmix|module load|openmpi|--account|--partition|--qos", template), name


def test_sbatch_lines_hold_the_requested_resources(tmp_path):
    site = jobs.load_site(SITES["example-cluster"])
    task = jobs.Task(
        index=0,
        name="fednest_seed1",
        config="configs/quadratic.toml",
        overrides=("seed=1",),
        output="runs/x/fednest_seed1.h5",
        ranks=6,
        sweep="v",
    )
    res = jobs.Resources(
        nodes=2, tasks_per_node=3, cpus_per_task=4, gpus_per_node=2, time="1-02:00:00", signal_seconds=240
    )
    text = jobs.render_run(site, task, res, workdir=ROOT, log_dir=tmp_path / "logs")
    lines = sbatch_lines(text)
    for expected in (
        "--job-name=v-fednest_seed1",
        "--nodes=2",
        "--ntasks-per-node=3",
        "--cpus-per-task=4",
        "--gpus-per-node=2",
        "--time=1-02:00:00",
        "--signal=B:USR1@240",
        "--requeue",
        f"--output={tmp_path}/logs/%x-%j.out",
        f"--error={tmp_path}/logs/%x-%j.err",
    ):
        assert f"#SBATCH {expected}" in lines, expected
    assert "RANKS=6" in text
    assert 'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"' in text
    assert '--set run.torch_threads="${SLURM_CPUS_PER_TASK:-1}"' in text
    assert "FEDNEST_RESUME_FLAG=--resume" in text and "${FEDNEST_RESUME_FLAG}" in text
    text0 = jobs.render_run(site, task, dataclasses.replace(res, gpus_per_node=0, signal_seconds=0))
    assert not any("gpus" in line or "--signal" in line for line in sbatch_lines(text0))
    assert "\n\n#SBATCH" not in text0  # an omitted option leaves no blank line behind

    sweep = jobs.load_sweep(SWEEPS / "quadratic_variants.toml")
    lines = sbatch_lines(jobs.render_array(site, sweep, tmp_path / "v.tasks", log_dir=tmp_path / "logs"))
    assert "#SBATCH --array=0-14%8" in lines and "#SBATCH --ntasks-per-node=4" in lines and "#SBATCH --nodes=1" in lines
    assert f"#SBATCH --output={tmp_path}/logs/%x-%A_%a.out" in lines and "#SBATCH --signal=B:USR1@120" in lines
    assert not any("gpus" in line for line in lines)
    # a scaling array asks for the largest run's allocation
    strong = jobs.load_sweep(SWEEPS / "strong_scaling.toml")
    lines = sbatch_lines(jobs.render_array(site, strong, "t"))
    assert "#SBATCH --array=0-4" in lines and "#SBATCH --nodes=2" in lines and "#SBATCH --ntasks-per-node=8" in lines


def test_template_placeholders_are_checked(tmp_path):
    (tmp_path / jobs.TEMPLATE_RUN).write_text("#!/bin/bash\n#SBATCH --nodes={{nodes}}\necho {{no_such_value}}\n")
    task = jobs.Task(index=0, name="t", config="c.toml", overrides=(), output="o.h5", ranks=1)
    with pytest.raises(UsageError, match=r"no value for \{\{no_such_value\}\}"):
        jobs.render_run(jobs.Site(), task, jobs.Resources(), templates=tmp_path)
    (tmp_path / jobs.TEMPLATE_RUN).write_text("#!/bin/bash\necho {{ nodes }} ${HOME} $@ {{nodes\n")
    with pytest.raises(UsageError, match="Invalid placeholder"):
        jobs.render_run(jobs.Site(), task, jobs.Resources(), templates=tmp_path)


# ----------------------------------------------------------------------------------------------
# Running the scripts


def test_requeued_job_resumes_and_the_checkpoint_signal_is_forwarded(tmp_path, fakebin):
    b, env, log = fakebin
    _write_exe(b / "srun", FAKE_SRUN_SLEEPY)
    site = dataclasses.replace(jobs.load_site(SITES["example-cluster"]), venv="")
    task = jobs.Task(
        index=0,
        name="t",
        config="configs/quadratic.toml",
        overrides=('algorithm.name="lfednest"',),
        output="runs/t.h5",
        ranks=2,
        sweep="s",
    )
    script = _write_exe(
        tmp_path / "run.sbatch", jobs.render_run(site, task, jobs.Resources(max_restarts=2), workdir=tmp_path)
    )

    # a first start: no --resume; USR1 to the batch shell reaches srun, then the job requeues itself
    proc = subprocess.Popen(
        ["bash", str(script)],
        env={**env, "SLURM_JOB_ID": "4242", "SLURM_CPUS_PER_TASK": "3", "FAKE_SLEEP_STEPS": "400"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 10
    while not Path(f"{log}.started").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    calls = log.read_text().splitlines()
    assert calls[0] == "module purge" and "module load openmpi/4.1.5" in calls
    srun = next(c for c in calls if c.startswith("srun "))
    assert srun.startswith(
        "srun -n 2 --mpi=pmix --cpu-bind=cores fednest-mpi run configs/quadratic.toml "
        '--set run.torch_threads=3 --set algorithm.name="lfednest" --output runs/t.h5'
    )
    assert "--resume" not in srun
    assert "srun got USR1" in calls and "scontrol requeue 4242" in calls

    # the requeued start resumes; past max_restarts it is not requeued again
    log.unlink()
    res = subprocess.run(
        ["bash", str(script)],
        env={**env, "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "2"},
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert res.returncode == 0, res.stderr
    srun = next(c for c in log.read_text().splitlines() if c.startswith("srun "))
    assert srun.endswith("--output runs/t.h5 --resume") and "--set run.torch_threads=1 " in srun
    assert "scontrol" not in log.read_text()


@needs_mpi
@pytest.mark.slow
def test_array_script_runs_its_own_task_per_array_id(tmp_path, fakebin):
    _, env, log = fakebin
    sweep_path = tiny_sweep(tmp_path, 'algorithm.name = ["lfednest", "fednest"]\nseed = [4, 5]')
    sweep = jobs.load_sweep(sweep_path)
    site = dataclasses.replace(jobs.load_site(SITES["example-cluster"]), venv=sys.prefix)
    tasks = jobs.expand(sweep)
    jobs.check_tasks(tasks, tmp_path)
    tasks_file = jobs.write_tasks_file(tasks, tmp_path / "jobs" / "tiny.tasks")
    script = _write_exe(
        tmp_path / "jobs" / "tiny.array.sbatch",
        jobs.render_array(site, sweep, tasks_file, workdir=tmp_path, log_dir=tmp_path / "jobs" / "logs"),
    )
    assert "#SBATCH --array=0-3" in script.read_text()
    for task_id in (0, 1):
        res = subprocess.run(
            ["bash", str(script)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "SLURM_ARRAY_TASK_ID": str(task_id), "SLURM_CPUS_PER_TASK": "1"},
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert res.stdout.strip().endswith(f"output: out/{tasks[task_id].name}.h5")
    assert "srun: 2 ranks: fednest-mpi run" in log.read_text()
    outputs = {task_id: tmp_path / "out" / f"lfednest_seed{seed}.h5" for task_id, seed in ((0, 4), (1, 5))}
    assert sorted(p.name for p in (tmp_path / "out").glob("*.h5")) == sorted(p.name for p in outputs.values())
    for task_id, path in outputs.items():
        attrs, data = read_run(path)
        assert attrs["mpi_size"] == 2
        assert attrs["config"]["seed"] == 4 + task_id and attrs["config"]["algorithm"]["name"] == "lfednest"
        assert attrs["config"]["run"]["torch_threads"] == 1 and attrs["config"]["problem"]["n_clients"] == 8
        assert data["iteration"].tolist() == [0, 1, 2]
    # a task id past the end is a usage error that names the file
    res = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=60, env={**env, "SLURM_ARRAY_TASK_ID": "4"}
    )
    assert res.returncode == 2 and "no task 4" in res.stderr


@needs_mpi
@pytest.mark.slow
def test_local_script_runs_the_sweep(tmp_path, fakebin):
    _, env, _ = fakebin
    env = {**env, "VIRTUAL_ENV": sys.prefix}
    sweep_path = tiny_sweep(
        tmp_path,
        "seed = [1, 2]",
        tasks_per_node=1,
        extra='name_pattern = "{algorithm.name}_s{seed}"\n[zip]\nalgorithm.name = ["fednest", "lfednest"]',
    )
    paths = jobs.render_all(sweep_path, SITES["local"], tmp_path / "jobs", workdir=tmp_path)
    script = next(p for p in paths if p.name == "tiny.local.sh")
    # 2 seeds x 2 zipped names; run tasks 0 and 3, both at once (1 rank each)
    res = subprocess.run(
        ["bash", str(script), "-j", "2", "0", "3"], capture_output=True, text=True, timeout=120, env=env
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all 2 tasks done" in res.stdout
    for name, seed, algorithm in (("fednest_s1", 1, "fednest"), ("lfednest_s2", 2, "lfednest")):
        attrs, _ = read_run(tmp_path / "out" / f"{name}.h5")
        assert (attrs["config"]["seed"], attrs["config"]["algorithm"]["name"], attrs["mpi_size"]) == (
            seed,
            algorithm,
            1,
        )
        assert f"task {0 if seed == 1 else 3}/4 {name}: done, output: out/{name}.h5" in res.stdout
        assert (tmp_path / "jobs" / "logs" / f"{name}.log").is_file()
    assert sorted(p.name for p in (tmp_path / "out").glob("*.h5")) == ["fednest_s1.h5", "lfednest_s2.h5"]
    # an existing output is the run's usage error: reported as refused, and the script exits 2 (not a result)
    res = subprocess.run(["bash", str(script), "0"], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 2 and "FAILED with exit 2" in res.stderr and "failed tasks: 0" in res.stderr
    assert "refused (exit 2, a usage error, not a result" in res.stderr


@needs_mpi
def test_local_script_skips_finished_runs_and_resumes_a_killed_one(tmp_path, fakebin):
    """FEDNEST_RUN_ARGS=--skip-finished (what the figure scripts pass unless -f): run again after a cut-off job,
    the finished run is kept as it is and the killed one continues from its checkpoint, to the values of a
    run that was never killed."""
    from fednest_mpi import config
    from fednest_mpi.comm import SerialComm
    from fednest_mpi.runner import FAULT_ENV
    from fednest_mpi.session import Session

    _, env, _ = fakebin
    sweep_path = tiny_sweep(tmp_path, "seed = [1, 2]", tasks_per_node=1)
    paths = jobs.render_all(sweep_path, SITES["local"], tmp_path / "jobs", workdir=tmp_path)
    script = str(next(p for p in paths if p.name == "tiny.local.sh"))
    kept, killed = (jobs.expand(jobs.load_sweep(sweep_path))[i] for i in (0, 1))
    skip = {**env, "VIRTUAL_ENV": sys.prefix, "FEDNEST_RUN_ARGS": "--skip-finished --set algorithm.outer_iterations=4"}

    def local(*args, **more):
        env = {**skip, **more}
        return subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=120, env=env)

    assert local("0").returncode == 0
    cut = local("1", **{FAULT_ENV: "0:2:kill"})  # SIGKILL in iteration 2: the file unclosed, the checkpoint at 0
    assert cut.returncode == 1 and "FAILED" in cut.stderr
    before = (tmp_path / kept.output).stat()
    res = local()
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"task 0/2 {kept.name}: done, output: {kept.output} (finished earlier: " in res.stdout
    after = (tmp_path / kept.output).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert "resuming after iteration 0" in (tmp_path / "jobs" / "logs" / f"{killed.name}.log").read_text()
    attrs, resumed = read_run(tmp_path / killed.output)
    assert resumed["iteration"].tolist() == [0, 1, 2, 3, 4] and len(json.loads(attrs["resumes"])) == 1
    whole = tmp_path / "whole.h5"
    cfg = config.load(ROOT / "configs" / "quadratic.toml", [*killed.overrides, "algorithm.outer_iterations=4"],
                      {"run.output": str(whole)})  # fmt: skip
    assert Session(cfg, SerialComm()).run_to_file() == 0
    _, direct = read_run(whole)
    for name in ("x_error", "outer_objective", "hypergradient_norm", "comm_rounds"):
        assert resumed[name].tolist() == direct[name].tolist(), name


def test_render_all_writes_nothing_when_a_path_cannot_go_on_an_sbatch_line(tmp_path):
    out = tmp_path / "with space"
    with pytest.raises(UsageError, match="#SBATCH --output cannot take spaces"):
        jobs.render_all(SWEEPS / "strong_scaling.toml", SITES["local"], out, workdir=ROOT)
    assert not out.exists()


def test_render_all_defaults_to_runs_jobs_in_the_work_directory(tmp_path):
    paths = jobs.render_all(tiny_sweep(tmp_path, "seed = [1, 2]"), SITES["local"], workdir=tmp_path)
    assert all(p.is_relative_to(tmp_path / "runs" / "jobs" / "tiny") for p in paths) and len(paths) == 5
    assert (tmp_path / "runs" / "jobs" / "tiny" / "tiny.tasks").read_text().count("\n") == 2


@pytest.mark.parametrize("limit,expected", [("00:05:00", 30), ("2", 12), ("00:30:00", 180), ("01:00:00", 300)])
def test_the_default_checkpoint_signal_fits_every_time_limit(tmp_path, limit, expected):
    """A sweep that sets only a short time limit (a 5-minute workstation sweep) is accepted: the default
    USR1 lead is 300 s, or a tenth of a shorter limit; one chosen explicitly is still checked."""
    path = write_sweep(
        tmp_path / "s.toml", f'config = "{ROOT / "configs" / "quadratic.toml"}"\n[resources]\ntime = "{limit}"\n'
    )
    assert jobs.load_sweep(path).resources.signal_seconds == expected
    text = (tmp_path / "s.toml").read_text()
    write_sweep(path, text + f"signal_seconds = {jobs.parse_time(limit)}\n")
    with pytest.raises(UsageError, match="is not less than the time limit"):
        jobs.load_sweep(path)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p.write_bytes(b'config = "\xff"\n'), "is not UTF-8 text (at byte 10); save it as UTF-8"),
        (os.mkfifo, "is a FIFO (named pipe), which would block the read for ever"),
        (lambda p: p.mkdir(), "is a folder"),
    ],
)
def test_a_sweep_file_that_is_no_text_file_is_one_line_naming_what_it_is(tmp_path, capsys, make, message):
    """Not UTF-8 (was a traceback), a FIFO (was 'does not exist'), a folder: one line, exit 2."""
    from fednest_mpi.cli import main

    path = tmp_path / "sweep.toml"
    make(path)
    assert main(["jobs", "list", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"sweep file '{path}' {message}" in err, err


def test_a_run_path_too_long_for_the_kernel_is_one_line_in_report_and_plot(tmp_path, capsys):
    """stat() of a name over NAME_MAX raises: the readers say so in one line (was a traceback)."""
    from fednest_mpi.cli import main

    path = tmp_path / ("d" * 300) / "run.h5"
    for command in (["report", str(path)], ["plot", str(path), "-o", str(tmp_path / "p.png")]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot be read (File name too long)" in err, err
