"""The benchmark harness: ``python -m bench SPEC.toml [key=value ...]`` (``make bench``: bench/quick.toml).

For every case of the spec (a problem config and the sizes to measure) it runs, each in its own
process (``mpiexec -n P`` for P > 1, see :mod:`bench.worker`):

* ``sequential``: the baseline of :mod:`bench.sequential` (one client at a time, autograd), 1 rank,
  for clients_per_round <= ``sequential_max_clients``;
* ``single``: this project, 1 rank;
* ``strong``: this project at each of ``strong_ranks`` with the same clients per round;
* ``weak``: this project at each of ``weak_ranks`` with ``weak_clients_per_rank`` clients per rank,

then writes every measurement to HDF5 (:mod:`fednest_mpi.io.bench`), prints the side-by-side
table (medians; ratios between rows of the same run) and plots speed-up and parallel efficiency.
Top-level keys of the spec can be overridden as ``key=value`` (TOML values), e.g. ``iterations=2``;
``only=["synth"]`` runs just the named cases.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fednest_mpi import config  # noqa: E402
from fednest_mpi.config import _merge  # noqa: E402  (table-by-table merge of the config files' base chains)
from fednest_mpi.data import resolve_data_dir  # noqa: E402
from fednest_mpi.errors import UsageError  # noqa: E402
from fednest_mpi.io.bench import write_bench  # noqa: E402

COLUMNS = {
    "case": ("benchmark case", ""),
    "problem": ("problem name", ""),
    "mode": ("sequential (baseline), single, strong or weak", ""),
    "ranks": ("MPI ranks", "1"),
    "clients_per_round": ("clients per round |S|", "1"),
    "n_clients": ("clients M", "1"),
    "alg_s": ("median over iterations of the algorithm part of one outer iteration (max over ranks)", "s"),
    "alg_s_min": ("fastest outer iteration (algorithm part)", "s"),
    "alg_cpu_s": ("median CPU time of the algorithm part of one outer iteration (max over ranks; MPI waits busy-poll)", "s"),
    "eval_s": ("median evaluation time per outer iteration", "s"),
    "comm_s": ("median time inside Allreduce per outer iteration on rank 0 (incl. waiting for slower ranks)", "s"),
    "comm_share": ("median of comm_s / alg_s on rank 0", "1"),
    "updates_per_s": ("client-updates per second: clients per round / alg_s", "1/s"),
    "peak_rss_mb": ("largest peak resident memory of any rank", "MiB"),
    "rss_growth_mb": ("largest RSS growth of any rank from the first to the last measured iteration", "MiB"),
    "speedup_vs_sequential": ("alg_s of the sequential baseline / alg_s (same case and clients, same harness run)", "1"),
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
    data = _merge(data, case.get("config", {}))
    problem = data.setdefault("problem", {})
    problem["n_clients"] = max(int(problem.get("n_clients", 100)), clients)
    data.setdefault("algorithm", {})["clients_per_round"] = clients
    data.setdefault("run", {})["progress"] = "never"
    config.from_dict(data)  # a bad case fails here, before any measurement
    return data


def run_one(spec: dict, case: dict, mode: str, ranks: int, clients: int) -> dict:
    data = case_config(case, clients)
    job = {"config": data, "mode": "sequential" if mode == "sequential" else "project",
           "iterations": int(case.get("iterations", spec.get("iterations", 3))), "warmup": int(spec.get("warmup", 1))}
    env = dict(os.environ, OMP_NUM_THREADS="1", MPI4PY_RC_THREAD_LEVEL="single")
    cmd = [sys.executable, str(ROOT / "bench" / "worker.py"), json.dumps(job)]
    if ranks > 1:
        cmd = shlex.split(spec.get("mpiexec", str(ROOT / ".venv" / "bin" / "mpiexec"))) + ["-n", str(ranks)] + cmd
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=float(spec.get("timeout", 900)))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"measurement {case['name']} {mode} P={ranks} |S|={clients} failed:\n{proc.stderr[-3000:]}")
    row = json.loads(lines[-1][6:])
    row.update({"case": case["name"], "problem": data["problem"]["name"], "mode": mode, "ranks": ranks,
                "clients_per_round": clients, "n_clients": data["problem"]["n_clients"], "seconds": time.perf_counter() - t0})
    return row


def plan(spec: dict, case: dict) -> list[tuple[str, int, int]]:
    """(mode, ranks, clients per round) of every measurement of a case, in run order."""
    jobs = []
    for c in case.get("clients_per_round", [10]):
        if c <= int(spec.get("sequential_max_clients", 100)) and case.get("sequential", True):
            jobs.append(("sequential", 1, c))
        jobs.append(("single", 1, c))
        jobs += [("strong", p, c) for p in case.get("strong_ranks", []) if p > 1]
    per_rank = int(case.get("weak_clients_per_rank", 0))
    jobs += [("weak", p, per_rank * p) for p in case.get("weak_ranks", []) if per_rank]
    return jobs


def derive(rows: list[dict]) -> None:
    """Ratios between rows of the same harness run: vs the baseline, strong and weak scaling."""
    def find(case, mode, ranks, clients):
        return next((r for r in rows if r["case"] == case and r["mode"] == mode and r["ranks"] == ranks
                     and r["clients_per_round"] == clients), None)

    for r in rows:
        seq = find(r["case"], "sequential", 1, r["clients_per_round"])
        if seq is not None and r["mode"] != "sequential" and r["ranks"] == 1:
            r["speedup_vs_sequential"] = seq["alg_s"] / r["alg_s"]
            r["speedup_vs_sequential_cpu"] = seq["alg_cpu_s"] / r["alg_cpu_s"]
        if r["mode"] == "strong":
            one = find(r["case"], "single", 1, r["clients_per_round"])
            if one is not None:
                r["speedup"] = one["alg_s"] / r["alg_s"]
                r["efficiency"] = r["speedup"] / r["ranks"]
        if r["mode"] == "weak":
            one = next((o for o in rows if o["case"] == r["case"] and o["ranks"] == 1
                        and o["mode"] in ("weak", "single") and o["clients_per_round"] * r["ranks"] == r["clients_per_round"]), None)
            if one is not None:
                r["efficiency"] = one["alg_s"] / r["alg_s"]
                r["speedup"] = r["efficiency"] * r["ranks"]


def table(rows: list[dict]) -> str:
    head = ["case", "mode", "P", "|S|", "alg s", "alg cpu s", "eval s", "upd/s", "comm %", "peak MiB", "dRSS MiB",
            "x seq", "x seq cpu", "speedup", "eff"]
    lines = ["  ".join(f"{h:>9}" for h in head)]

    def f(v, fmt):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    for r in rows:
        cells = [r["case"][:9], r["mode"], str(r["ranks"]), str(r["clients_per_round"]), f(r["alg_s"], ".4f"), f(r["alg_cpu_s"], ".4f"),
                 f(r["eval_s"], ".4f"),
                 f(r["updates_per_s"], ".1f"), f(100 * r["comm_share"], ".1f"), f(r["peak_rss_mb"], ".0f"), f(r["rss_growth_mb"], ".1f"),
                 f(r.get("speedup_vs_sequential"), ".1f"), f(r.get("speedup_vs_sequential_cpu"), ".1f"), f(r.get("speedup"), ".2f"),
                 f(r.get("efficiency"), ".2f")]
        lines.append("  ".join(f"{c:>9}" for c in cells))
    return "\n".join(lines)


def plot(rows: list[dict], prefix: str) -> list[str]:
    """speed-up and efficiency against ranks, one line per (case, |S|) (strong) or case (weak)."""
    from matplotlib.figure import Figure

    written = []
    for mode in ("strong", "weak"):
        series: dict[str, list[tuple[int, float, float]]] = {}
        for r in rows:
            if r["mode"] == mode and r.get("speedup") is not None:
                label = f"{r['case']} |S|={r['clients_per_round']}" if mode == "strong" else f"{r['case']} {r['clients_per_round'] // r['ranks']}/rank"
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
        ax2.set(xlabel="ranks", ylabel="parallel efficiency", ylim=(0, max(1.2, 1.1 * max(e for pts in series.values() for _, _, e in pts))))
        ax1.legend(fontsize=7)
        fig.tight_layout()
        out = f"{prefix}_{mode}.png"
        fig.savefig(out, dpi=110)
        written.append(out)
    return written


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    spec = load_spec(argv[0], argv[1:])
    out = Path(spec.get("output", "bench/results/bench.h5"))
    attrs = {"spec_json": json.dumps(spec), "cpu_count": os.cpu_count() or 0}
    rows = []
    only = spec.get("only")  # e.g. only=["synth"]: run just these cases of the spec
    for case in spec.get("case", []):
        if only is not None and case["name"] not in only:
            continue
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
            rows.append(row)
            print(f"  {case['name']} {mode} P={ranks} |S|={clients}: {row['alg_s']:.4f} s algorithm, "
                  f"{row['eval_s']:.4f} s evaluation ({row['seconds']:.0f} s)", flush=True)
            derive(rows)
            write_bench(out, rows, COLUMNS, attrs)  # after every measurement: a crash keeps the others
    derive(rows)
    write_bench(out, rows, COLUMNS, attrs)
    print(table(rows))
    written = plot(rows, str(out.with_suffix("")))
    print(f"wrote {out}" + (" and " + ", ".join(written) if written else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
