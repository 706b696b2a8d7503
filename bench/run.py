"""The benchmark harness: ``python -m bench SPEC.toml [key=value ...]`` (``make bench``: bench/quick.toml).

For every case of the spec (a problem config and the sizes to measure) it runs, each in its own
process (``mpiexec -n P`` for P > 1, see :mod:`bench.worker`), wrapped in :mod:`bench.rusage` (the
``/usr/bin/time -v`` numbers of the whole process tree):

* ``plain``: the plain per-client PyTorch loop of :mod:`bench.plain`, 1 rank, when the case says
  ``plain = true`` (clients_per_round <= ``plain_max_clients``, a key of the spec or the case);
* ``sequential``: the baseline of :mod:`bench.sequential` (one client at a time, autograd, inside
  this package's algorithms), 1 rank, for clients_per_round <= ``sequential_max_clients``;
* ``single``: this project, 1 rank (unless the case says ``single = false``);
* ``strong``: this project at each of ``strong_ranks`` with the same clients per round;
* ``weak``: this project at each of ``weak_ranks`` with ``weak_clients_per_rank`` clients per rank,

then writes every measurement to HDF5 (:mod:`fednest_mpi.io.bench`), prints the side-by-side
tables (medians; ratios between rows of the same run) and plots speed-up and parallel efficiency.
Cases of the plain loop's problems (:data:`bench.plain.PROBLEMS`) also get their FLOP and
memory-traffic floors per round (:mod:`bench.floors`) and the ratio of the measured time to them,
with this core's GEMM rate and copy bandwidth measured once at the start (file attributes
``gemm_flops``, ``copy_bandwidth``); ``allreduce_ranks = [1, 2]`` measures Allreduce latency and
bandwidth (:mod:`bench.allreduce`; attribute ``allreduce_json``) for the cost model
(``python -m bench.model FILE.h5``). Top-level keys of the spec can be overridden as ``key=value``
(TOML values), e.g. ``iterations=2``; ``only=["synth"]`` runs just the named cases,
``families=["many"]`` just the cases of those ``family`` values. A case may set ``chunk_clients`` and
``block_memory`` (the ``run`` section's chunked-executor knobs) directly, ``versus`` (another case's
name: the ratio of their single-rank times, e.g. derived against closed-form oracles) and ``pythonpath``
(folders of its plugins, relative to the checkout).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import floors  # noqa: E402
from bench.plain import PROBLEMS, ClientData  # noqa: E402
from fednest_mpi import config  # noqa: E402
from fednest_mpi.config import merge_layers  # noqa: E402  (table-by-table merge of the config files' base chains)
from fednest_mpi.data import resolve_data_dir  # noqa: E402
from fednest_mpi.errors import UsageError  # noqa: E402
from fednest_mpi.io.bench import write_bench  # noqa: E402

COLUMNS = {
    "case": ("benchmark case", ""),
    "problem": ("problem name", ""),
    "mode": ("plain (per-client PyTorch loop), sequential (baseline), single, strong or weak", ""),
    "ranks": ("MPI ranks", "1"),
    "clients_per_round": ("clients per round |S|", "1"),
    "n_clients": ("clients M", "1"),
    "alg_s": ("median over iterations of the algorithm part of one outer iteration (max over ranks)", "s"),
    "alg_s_min": ("fastest outer iteration (algorithm part)", "s"),
    "alg_cpu_s": (
        "median CPU time of the algorithm part of one outer iteration (max over ranks; MPI waits busy-poll)",
        "s",
    ),
    "eval_s": ("median evaluation time per outer iteration", "s"),
    "comm_s": ("median time inside Allreduce per outer iteration on rank 0 (incl. waiting for slower ranks)", "s"),
    "comm_share": ("median of comm_s / alg_s on rank 0", "1"),
    "updates_per_s": ("client-updates per second: clients per round / alg_s", "1/s"),
    "user_s": ("median user CPU of the algorithm part of one outer iteration, summed over ranks (getrusage)", "s"),
    "sys_s": ("median system CPU of the algorithm part of one outer iteration, summed over ranks", "s"),
    "minflt": ("median minor page faults in the algorithm part of one outer iteration, summed over ranks", "1"),
    "proc_user_s": ("user CPU of the whole measurement process tree (start-up and warm-up included; time -v)", "s"),
    "proc_sys_s": ("system CPU of the whole measurement process tree", "s"),
    "proc_minflt": ("minor page faults of the whole measurement process tree", "1"),
    "proc_maxrss_mb": (
        "largest peak RSS of any process of the measurement (time -v's maximum resident set size)",
        "MiB",
    ),
    "allreduce_calls": ("median algorithm Allreduces per outer iteration (project rows)", "1"),
    "allreduce_bytes": ("median bytes aggregated per outer iteration and rank (project rows)", "B"),
    "flop_floor": ("arithmetic floor of one outer iteration, all ranks together (bench/floors.py)", "FLOP"),
    "traffic_floor": ("memory-traffic floor of one outer iteration, all ranks together (bench/floors.py)", "B"),
    "x_flop_floor": ("alg_s / (flop_floor / (gemm_flops x ranks)): how far above the arithmetic floor", "1"),
    "x_traffic_floor": ("alg_s / (traffic_floor / (copy_bandwidth x ranks)): how far above the traffic floor", "1"),
    "generation_floor_s": (
        "seconds of keyed normals a round must generate without kept clients, all ranks together (bench/floors.py)",
        "s",
    ),
    "x_generation_flop_floor": (
        "alg_s / ((generation_floor_s + flop_floor / gemm_flops) / ranks): how far above the generation + FLOP floor",
        "1",
    ),
    "speedup_vs_plain": ("alg_s of the plain loop / alg_s (same case and clients, same harness run)", "1"),
    "speedup_vs_plain_cpu": ("the same ratio of alg_cpu_s", "1"),
    "time_vs_case": ("alg_s / alg_s of the case this case names as its versus (same clients, same harness run)", "1"),
    "time_vs_case_cpu": ("the same ratio of alg_cpu_s", "1"),
    "peak_rss_mb": ("largest peak resident memory of any rank", "MiB"),
    "rss_growth_mb": ("largest RSS growth of any rank from the first to the last measured iteration", "MiB"),
    "speedup_vs_sequential": (
        "alg_s of the sequential baseline / alg_s (same case and clients, same harness run)",
        "1",
    ),
    "speedup_vs_sequential_cpu": ("the same ratio of alg_cpu_s", "1"),
    "speedup": ("strong: alg_s at 1 rank / alg_s; weak: alg_s at 1 rank x ranks / alg_s", "1"),
    "efficiency": ("parallel efficiency: speedup / ranks", "1"),
    "final_test_accuracy": ("test accuracy after the last iteration (sanity check)", "%"),
    "seconds": ("wall time of the whole measurement process (startup included)", "s"),
}


def load_spec(path: str, overrides: list[str]) -> dict:
    spec = tomllib.loads(Path(path).read_text())
    for text in overrides:
        keys, value = config.parse_override(text)
        node = spec
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return spec


def case_config(case: dict, clients: int) -> dict:
    """The run config (plain data) of one case at ``clients`` per round."""
    data = config.read_file(ROOT / case["base"]) if "base" in case else {}
    data = merge_layers(data, case.get("config", {}))
    problem = data.setdefault("problem", {})
    problem["n_clients"] = max(int(problem.get("n_clients", 100)), clients)
    data.setdefault("algorithm", {})["clients_per_round"] = clients
    data.setdefault("run", {})["progress"] = "never"
    for knob in ("chunk_clients", "block_memory"):  # the chunked executor's knobs (run section), as case options
        if knob in case:
            data["run"][knob] = case[knob]
    config.from_dict(data)  # a bad case fails here, before any measurement
    return data


def run_one(spec: dict, case: dict, mode: str, ranks: int, clients: int) -> dict:
    data = case_config(case, clients)
    job = {
        "config": data,
        "mode": mode if mode in ("sequential", "plain") else "project",
        "iterations": int(case.get("iterations", spec.get("iterations", 3))),
        "warmup": int(spec.get("warmup", 1)),
    }
    env = dict(os.environ, OMP_NUM_THREADS="1", MPI4PY_RC_THREAD_LEVEL="single")
    if case.get("pythonpath"):  # folders of a case's plugins (e.g. a model's module), relative to the checkout
        folders = [str(ROOT / f) for f in case["pythonpath"]] + [p for p in [env.get("PYTHONPATH", "")] if p]
        env["PYTHONPATH"] = os.pathsep.join(folders)
    cmd = [sys.executable, str(ROOT / "bench" / "worker.py"), json.dumps(job)]
    if ranks > 1:
        cmd = shlex.split(spec.get("mpiexec", str(ROOT / ".venv" / "bin" / "mpiexec"))) + ["-n", str(ranks)] + cmd
    cmd = [sys.executable, str(ROOT / "bench" / "rusage.py")] + cmd
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=float(spec.get("timeout", 900)))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"measurement {case['name']} {mode} P={ranks} |S|={clients} failed:\n{proc.stderr[-3000:]}")
    row = json.loads(lines[-1][6:])
    usage = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RUSAGE "))[7:])
    row.update({f"proc_{k}": usage[k] for k in ("user_s", "sys_s", "minflt", "maxrss_mb")})
    row.update(
        {
            "case": case["name"],
            "problem": data["problem"]["name"],
            "mode": mode,
            "ranks": ranks,
            "clients_per_round": clients,
            "n_clients": data["problem"]["n_clients"],
            "seconds": time.perf_counter() - t0,
        }
    )
    return row


_SIZES: dict[str, tuple[float, float]] = {}


def add_floors(row: dict, data: dict, rates: dict) -> None:
    """The FLOP and traffic floors of a row whose problem the plain loop knows with its MLP (else nothing)."""
    if (
        data["problem"].get("model")
        or data["problem"]["name"] not in PROBLEMS
        or data["algorithm"].get("name", "fednest")
        not in (
            "fedavg",
            "fednest",
            "fednest_sgd",
        )
    ):
        return
    cfg = config.from_dict(data)
    key = json.dumps([data["problem"], data.get("seed", 0)], sort_keys=True)
    if key not in _SIZES:  # mean samples per client of this partition (one load per problem config)
        _SIZES[key] = ClientData(cfg.problem, cfg.seed, getattr(torch, cfg.run.dtype)).sizes()
    shape = floors.shape_of(cfg, *_SIZES[key])
    flop, traffic = floors.floors(shape)
    row.update(
        {
            "flop_floor": flop,
            "traffic_floor": traffic,
            "x_flop_floor": row["alg_s"] * rates["gemm_flops"] * row["ranks"] / flop,
            "x_traffic_floor": row["alg_s"] * rates["copy_bandwidth"] * row["ranks"] / traffic,
        }
    )
    if shape.generated_normals and "normal_seconds" in rates:
        generation = floors.generation_seconds(shape, rates["normal_seconds"])
        floor = (generation + flop / rates["gemm_flops"]) / row["ranks"]
        row.update({"generation_floor_s": generation, "x_generation_flop_floor": row["alg_s"] / floor})


def plan(spec: dict, case: dict) -> list[tuple[str, int, int]]:
    """(mode, ranks, clients per round) of every measurement of a case, in run order."""
    jobs = []
    for c in case.get("clients_per_round", [10]):
        if case.get("plain", False) and c <= int(case.get("plain_max_clients", spec.get("plain_max_clients", 10**9))):
            jobs.append(("plain", 1, c))
        if c <= int(spec.get("sequential_max_clients", 100)) and case.get("sequential", True):
            jobs.append(("sequential", 1, c))
        if case.get("single", True):
            jobs.append(("single", 1, c))
        jobs += [("strong", p, c) for p in case.get("strong_ranks", []) if p > 1]
    per_rank = int(case.get("weak_clients_per_rank", 0))
    jobs += [("weak", p, per_rank * p) for p in case.get("weak_ranks", []) if per_rank]
    return jobs


def derive(rows: list[dict], cases: list[dict] | None = None) -> None:
    """Ratios between rows of the same harness run: vs the baselines, vs the case a case names as its
    ``versus`` (e.g. derived against closed-form oracles), strong and weak scaling."""
    case_of = {c["name"]: c for c in cases or []}

    def find(case, mode, ranks, clients):
        return next(
            (
                r
                for r in rows
                if r["case"] == case and r["mode"] == mode and r["ranks"] == ranks and r["clients_per_round"] == clients
            ),
            None,
        )

    for r in rows:
        for base in ("sequential", "plain"):
            ref = find(r["case"], base, 1, r["clients_per_round"])
            if ref is not None and r["mode"] not in ("sequential", "plain"):
                r[f"speedup_vs_{base}"] = ref["alg_s"] / r["alg_s"]
                r[f"speedup_vs_{base}_cpu"] = ref["alg_cpu_s"] / r["alg_cpu_s"]
        versus = case_of.get(r["case"], {}).get("versus")
        if versus and r["mode"] == "single":
            ref = find(versus, "single", 1, r["clients_per_round"])
            if ref is not None:
                r["time_vs_case"] = r["alg_s"] / ref["alg_s"]
                r["time_vs_case_cpu"] = r["alg_cpu_s"] / ref["alg_cpu_s"]
        if r["mode"] == "strong":
            one = find(r["case"], "single", 1, r["clients_per_round"])
            if one is not None:
                r["speedup"] = one["alg_s"] / r["alg_s"]
                r["efficiency"] = r["speedup"] / r["ranks"]
        if r["mode"] == "weak":
            one = next(
                (
                    o
                    for o in rows
                    if o["case"] == r["case"]
                    and o["ranks"] == 1
                    and o["mode"] in ("weak", "single")
                    and o["clients_per_round"] * r["ranks"] == r["clients_per_round"]
                ),
                None,
            )
            if one is not None:
                r["efficiency"] = one["alg_s"] / r["alg_s"]
                r["speedup"] = r["efficiency"] * r["ranks"]


# (header, key, format; a key of None = the formatter's own): the scaling table and the many-clients table
SCALING = [
    ("case", "case", "s"),
    ("mode", "mode", "s"),
    ("P", "ranks", "d"),
    ("|S|", "clients_per_round", "d"),
    ("alg s", "alg_s", ".4f"),
    ("alg cpu s", "alg_cpu_s", ".4f"),
    ("eval s", "eval_s", ".4f"),
    ("upd/s", "updates_per_s", ".1f"),
    ("comm %", "comm_share", "%"),
    ("peak MiB", "peak_rss_mb", ".0f"),
    ("dRSS MiB", "rss_growth_mb", ".1f"),
    ("x seq", "speedup_vs_sequential", ".1f"),
    ("x seq cpu", "speedup_vs_sequential_cpu", ".1f"),
    ("speedup", "speedup", ".2f"),
    ("eff", "efficiency", ".2f"),
]
MANY = [
    ("case", "case", "s"),
    ("mode", "mode", "s"),
    ("P", "ranks", "d"),
    ("|S|", "clients_per_round", "d"),
    ("s/round", "alg_s", ".3f"),
    ("upd/s", "updates_per_s", ".0f"),
    ("user s", "user_s", ".3f"),
    ("sys s", "sys_s", ".3f"),
    ("minflt", "minflt", ".0f"),
    ("peak MiB", "peak_rss_mb", ".0f"),
    ("GFLOP", "flop_floor", "G"),
    ("x flop", "x_flop_floor", ".1f"),
    ("GB", "traffic_floor", "G"),
    ("x traffic", "x_traffic_floor", ".1f"),
    ("x gen+flop", "x_generation_flop_floor", ".1f"),
    ("x plain", "speedup_vs_plain", ".2f"),
    ("x plain cpu", "speedup_vs_plain_cpu", ".2f"),
    ("t/versus", "time_vs_case", ".2f"),
    ("t/vs cpu", "time_vs_case_cpu", ".2f"),
]


def table(rows: list[dict], columns=SCALING) -> str:
    def f(v, fmt):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        if fmt == "s":
            return str(v)[:11]
        if fmt == "%":
            return format(100 * v, ".1f")
        return format(v / 1e9, ".3g") if fmt == "G" else format(int(v) if fmt == "d" else v, fmt)

    lines = ["  ".join(f"{h:>11}" for h, _, _ in columns)]
    lines += ["  ".join(f"{f(r.get(key), fmt):>11}" for _, key, fmt in columns) for r in rows]
    return "\n".join(lines)


def measure_allreduce(spec: dict) -> dict:
    """{ranks: {"bytes": [...], "seconds": [...]}} of :mod:`bench.allreduce` at each of ``allreduce_ranks``."""
    out = {}
    env = dict(os.environ, OMP_NUM_THREADS="1", MPI4PY_RC_THREAD_LEVEL="single")
    for p in spec.get("allreduce_ranks", []):
        cmd = [sys.executable, str(ROOT / "bench" / "allreduce.py"), str(int(spec.get("allreduce_max_bytes", 2**24)))]
        if p > 1:
            cmd = shlex.split(spec.get("mpiexec", str(ROOT / ".venv" / "bin" / "mpiexec"))) + ["-n", str(p)] + cmd
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ALLREDUCE ")), None)
        if proc.returncode or line is None:
            print(f"  FAILED allreduce P={p}: {proc.stderr[-2000:]}", flush=True)
            continue
        out[str(p)] = json.loads(line[10:])
        print(
            f"  allreduce P={p}: {out[str(p)]['seconds'][0] * 1e6:.2f} us at {out[str(p)]['bytes'][0]} B, "
            f"{out[str(p)]['seconds'][-1] * 1e3:.2f} ms at {out[str(p)]['bytes'][-1]} B",
            flush=True,
        )
    return out


def plot(rows: list[dict], prefix: str) -> list[str]:
    """speed-up and efficiency against ranks, one line per (case, |S|) (strong) or case (weak)."""
    from matplotlib.figure import Figure

    written = []
    for mode in ("strong", "weak"):
        series: dict[str, list[tuple[int, float, float]]] = {}
        for r in rows:
            if r["mode"] == mode and r.get("speedup") is not None:
                label = (
                    f"{r['case']} |S|={r['clients_per_round']}"
                    if mode == "strong"
                    else f"{r['case']} {r['clients_per_round'] // r['ranks']}/rank"
                )
                series.setdefault(label, [(1, 1.0, 1.0)]).append((r["ranks"], r["speedup"], r["efficiency"]))
        if not series:
            continue
        fig = Figure(figsize=(9, 3.6))
        ax1, ax2 = fig.subplots(1, 2)
        top = max(p for pts in series.values() for p, _, _ in pts)
        for label, pts in series.items():
            pts.sort()
            ax1.plot([p for p, _, _ in pts], [s for _, s, _ in pts], "o-", label=label)
            ax2.plot([p for p, _, _ in pts], [e for _, _, e in pts], "o-", label=label)
        ax1.plot([1, top], [1, top], "k:", label="ideal")
        ax2.axhline(1.0, color="k", ls=":")
        ax1.set(xlabel="ranks", ylabel="speed-up", title=f"{mode} scaling")
        ax2.set(
            xlabel="ranks",
            ylabel="parallel efficiency",
            ylim=(0, max(1.2, 1.1 * max(e for pts in series.values() for _, _, e in pts))),
        )
        ax1.legend(fontsize=7)
        fig.tight_layout()
        out = f"{prefix}_{mode}.png"
        fig.savefig(out, dpi=110)
        written.append(out)
    return written


def selected(spec: dict) -> list[dict]:
    """The cases of the spec that ``only`` and ``families`` let through."""
    only, families = spec.get("only"), spec.get("families")
    return [
        c
        for c in spec.get("case", [])
        if (only is None or c["name"] in only) and (families is None or c.get("family", "") in families)
    ]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    spec = load_spec(argv[0], argv[1:])
    out = Path(spec.get("output", "bench/results/bench.h5"))
    torch.set_num_threads(1)
    rates = floors.machine_rates(copy_mib=int(spec.get("copy_mib", 256)))
    print(
        f"this core: {rates['gemm_flops'] / 1e9:.1f} GFLOP/s float32 GEMM, "
        f"{rates['copy_bandwidth'] / 1e9:.2f} GB/s copy, {rates['normal_seconds'] * 1e9:.2f} ns per keyed normal",
        flush=True,
    )
    attrs = {
        "spec_json": json.dumps(spec),
        "cpu_count": os.cpu_count() or 0,
        **rates,
        "allreduce_json": json.dumps(measure_allreduce(spec)),
    }
    rows = []
    for case in selected(spec):
        if case.get("requires_data"):
            try:
                resolve_data_dir(None, "mnist")
            except UsageError as exc:
                print(f"skipping {case['name']}: {exc}", flush=True)
                continue
        for mode, ranks, clients in plan(spec, case):
            try:
                row = run_one(spec, case, mode, ranks, clients)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # keep the other measurements
                print(f"  FAILED {case['name']} {mode} P={ranks} |S|={clients}: {exc}", flush=True)
                continue
            add_floors(row, case_config(case, clients), rates)
            rows.append(row)
            print(
                f"  {case['name']} {mode} P={ranks} |S|={clients}: {row['alg_s']:.4f} s algorithm "
                f"(user {row['user_s']:.3f} s, sys {row['sys_s']:.3f} s), {row['eval_s']:.4f} s evaluation "
                f"({row['seconds']:.0f} s)",
                flush=True,
            )
            derive(rows, selected(spec))
            write_bench(out, rows, COLUMNS, attrs)  # after every measurement: a crash keeps the others
    derive(rows, selected(spec))
    write_bench(out, rows, COLUMNS, attrs)
    family = {c["name"] for c in selected(spec) if c.get("family") == "many"}
    many = [r for r in rows if r["case"] in family]
    if len(many) < len(rows):
        print(table([r for r in rows if r["case"] not in family]))
    if many:
        print("many clients (floors: bench/floors.py; x plain = plain loop s/round / this row's)")
        print(table(many, MANY))
    written = plot(rows, str(out.with_suffix("")))
    print(f"wrote {out}" + (" and " + ", ".join(written) if written else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
