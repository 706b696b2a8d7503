"""Read a run file (docs/tutorial.md, step 3): python examples/tutorial/read_run.py runs/tutorial/quadratic.h5"""

import sys

from fednest_mpi.api import read_run
from fednest_mpi.post import load_clients, load_run

path = sys.argv[1]

# 1. plain numpy: the file's attributes (a dict) and /iterations ({column: array}, entry k after iteration k)
attrs, data = read_run(path)
print(attrs["problem"], attrs["algorithm"], "on", attrs["mpi_size"], "rank(s), seed", attrs["seed"])
print("outer_lr of the run:", attrs["config"]["algorithm"]["outer_lr"])
print("columns:", ", ".join(sorted(data)))
print("x_error after iteration 10:", data["x_error"][10], "after", data["comm_rounds"][10], "rounds")

# 2. pandas: one row per iteration, and the per-client series (one row per client and iteration it took part in)
df = load_run(path)
print(df[["iteration", "comm_rounds", "x_error"]].iloc[::10].to_string(index=False))
clients = load_clients(path)
print("per-client series:", ", ".join(clients.columns), f"({len(clients)} rows)")
