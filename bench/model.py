"""Cost model of a round, fitted to a bench file: ``python -m bench.model RESULTS.h5 [key=value ...]``.

    t(case, P, |S|) = a + b ceil(|S| / P)                                          compute
                    + calls ceil(log2 P) alpha + 2 (P - 1) / P bytes beta            Allreduce

* compute: per case (and separately for its plain-loop rows), a = fixed cost of a round and
  b = cost per participating client (the client's steps, oracles and data), least squares over the
  1-rank rows of the file (with a single size: a = 0, b = t / |S|); b / steps = per client-step;
* Allreduce: ``calls`` and ``bytes`` per round (per rank) are the measured ones of the case's
  project rows; alpha (latency) and beta (inverse bandwidth) are fitted to the file's Allreduce
  ping at 2 ranks (:mod:`bench.allreduce`), where both terms are exact for recursive doubling and
  for Rabenseifner's / ring Allreduce (t = alpha + beta n at P = 2). For P ranks the model takes
  ceil(log2 P) latency steps and the bandwidth term of a ring (2 (P - 1) / P n beta).

The command prints the fitted constants, predicted against measured time for every row of the file
(relative error), and the prediction at ``nodes`` x ``ranks_per_node`` ranks (64 x 64) and ``clients``
per round (10^6) with its assumptions; it writes a plot (predicted vs measured; predicted time per
round against ranks at ``clients``) to ``plot`` (default: next to the file, ``*_model.png``).
``alpha=`` (s) and ``beta=`` (s per byte) replace the fitted network constants; ``time=cpu`` fits
and compares the CPU time of the algorithm part (``alg_cpu_s``, steadier on a shared machine)
instead of its wall time.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fednest_mpi.io.bench import read_bench  # noqa: E402

PROJECT_MODES = ("single", "strong", "weak")


@dataclass(frozen=True)
class Network:
    alpha: float  # s per Allreduce step
    beta: float  # s per byte

    def allreduce(self, ranks: int, calls: float, nbytes: float) -> float:
        """Seconds of ``calls`` Allreduces moving ``nbytes`` in all (per rank) among ``ranks`` ranks."""
        if ranks <= 1:
            return 0.0
        return calls * math.ceil(math.log2(ranks)) * self.alpha + 2.0 * (ranks - 1) / ranks * nbytes * self.beta


@dataclass(frozen=True)
class Compute:
    a: float  # s per round
    b: float  # s per participating client
    sizes: int = 2  # distinct |S| fitted (1: a = 0 assumed)

    def seconds(self, clients: int, ranks: int) -> float:
        return self.a + self.b * math.ceil(clients / ranks)


def fit_alpha_beta(nbytes, seconds) -> Network:
    """alpha + beta n fitted to Allreduce times at 2 ranks, least squares in relative error."""
    n, t = np.asarray(nbytes, dtype=float), np.asarray(seconds, dtype=float)
    A = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    return Network(float(alpha), float(beta))


def fit_compute(clients, seconds) -> Compute:
    """a + b |S| by least squares over 1-rank rows; one distinct size: a = 0."""
    c, t = np.asarray(clients, dtype=float), np.asarray(seconds, dtype=float)
    if np.unique(c).size < 2:
        return Compute(0.0, float(np.mean(t / c)), 1)
    (b, a), *_ = np.linalg.lstsq(np.stack([c, np.ones_like(c)], axis=1), t, rcond=None)
    return Compute(float(a), float(b), int(np.unique(c).size))


def group(row: dict) -> tuple[str, str]:
    kind = "project" if row["mode"] in PROJECT_MODES else row["mode"]
    return row["case"], kind


@dataclass
class Model:
    network: Network
    compute: dict  # group -> Compute
    comm: dict  # case -> (calls, bytes) per round and rank

    def predict(self, key: tuple[str, str], ranks: int, clients: int) -> tuple[float, float]:
        """(compute, communication) seconds of a round."""
        calls, nbytes = self.comm.get(key[0], (0.0, 0.0)) if key[1] == "project" else (0.0, 0.0)
        return self.compute[key].seconds(clients, ranks), self.network.allreduce(ranks, calls, nbytes)


def fit(rows: list[dict], network: Network, measure: str = "alg_s") -> Model:
    """The model of ``rows`` (``measure``: the column fitted, alg_s = wall time or alg_cpu_s)."""
    compute, comm = {}, {}
    for key in dict.fromkeys(group(r) for r in rows):
        ones = [r for r in rows if group(r) == key and r["ranks"] == 1]
        if ones:
            compute[key] = fit_compute([r["clients_per_round"] for r in ones], [r[measure] for r in ones])
        measured = [r for r in rows if group(r) == key and not math.isnan(r.get("allreduce_calls", math.nan))]
        if key[1] == "project" and measured:
            comm[key[0]] = (
                float(np.median([r["allreduce_calls"] for r in measured])),
                float(np.median([r["allreduce_bytes"] for r in measured])),
            )
    return Model(network, compute, comm)


def network_of(attrs: dict, alpha: float | None, beta: float | None) -> tuple[Network, str]:
    pings = json.loads(attrs.get("allreduce_json", "{}") or "{}")
    if "2" in pings:
        fitted = fit_alpha_beta(pings["2"]["bytes"], pings["2"]["seconds"])
        source = "fitted to this file's 2-rank Allreduce ping"
    else:
        fitted, source = Network(math.nan, math.nan), "no 2-rank ping in the file"
    if alpha is not None or beta is not None:
        source += "; overridden on the command line"
    return Network(fitted.alpha if alpha is None else alpha, fitted.beta if beta is None else beta), source


def report(
    model: Model, rows: list[dict], ranks: int, clients: int, note: str, measure: str = "alg_s"
) -> tuple[str, list[tuple]]:
    """The printed report and the (key, measured, predicted, ranks) points of the plot."""
    net = model.network
    lines = [
        f"Allreduce: alpha = {net.alpha * 1e6:.2f} us, beta = {net.beta * 1e9:.3f} ns/B "
        f"({1 / net.beta / 1e9 if net.beta > 0 else math.nan:.2f} GB/s) ({note})",
        "",
        f"compute per round = a + b ceil(|S| / P), fitted to the 1-rank rows' {measure}:",
    ]
    for (case, kind), c in model.compute.items():
        lines.append(
            f"  {case:>16} {kind:>10}: a = {c.a:8.4f} s, b = {c.b * 1e3:9.4f} ms per client"
            + ("" if c.sizes > 1 else "  (one |S|: a = 0 assumed)")
        )
    lines += [
        "",
        f"{'case':>16} {'kind':>10} {'P':>3} {'|S|':>7} {'measured s':>11} {'predicted s':>11} {'rel. error':>10}",
    ]
    points = []
    for r in rows:
        key = group(r)
        if key not in model.compute:
            continue
        pred = sum(model.predict(key, int(r["ranks"]), int(r["clients_per_round"])))
        points.append((key, r[measure], pred, int(r["ranks"])))
        lines.append(
            f"{key[0]:>16} {key[1]:>10} {int(r['ranks']):>3} {int(r['clients_per_round']):>7} "
            f"{r[measure]:>11.4f} "
            f"{pred:>11.4f} {100 * (pred - r[measure]) / r[measure]:>9.1f}%"
        )
    lines += ["", f"prediction: {ranks} ranks, {clients:,} clients per round ({math.ceil(clients / ranks)} per rank):"]
    for key in model.compute:
        if key[1] != "project":
            continue
        comp, comm = model.predict(key, ranks, clients)
        calls, nbytes = model.comm.get(key[0], (0.0, 0.0))
        lines.append(
            f"  {key[0]:>16}: {comp + comm:9.3f} s per round = compute {comp:.3f} s + Allreduce {comm:.4f} s "
            f"({calls:.0f} calls, {nbytes / 1e6:.2f} MB per rank)"
        )
    lines += [
        "assumptions: every rank computes at the speed measured here on one core (1 thread per rank, no",
        "memory-bandwidth sharing between the ranks of a node); perfectly balanced clients (balanced placement);",
        "the per-client cost does not change with |S| / P; the Allreduces of a round are those measured",
        "here (count, bytes), each costing ceil(log2 P) alpha + 2 (P-1)/P n beta with alpha, beta as above for",
        "every link (the 2-rank shared-memory ping here: an inter-node network has a larger alpha; pass alpha=,",
        "beta=); no OS noise.",
    ]
    return "\n".join(lines), points


def plot(model: Model, points: list[tuple], clients: int, top: int, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    ax1, ax2 = fig.subplots(1, 2)
    marker = {"project": "o", "plain": "s", "sequential": "^"}
    for j, key in enumerate(dict.fromkeys(k for k, *_ in points)):
        color = f"C{j % 10}"
        for fitted in (True, False):  # filled: 1-rank rows (fitted); hollow: the others (predicted)
            m = [(meas, pred) for k, meas, pred, p in points if k == key and (p == 1) == fitted]
            if m:
                ax1.loglog(
                    [a for a, _ in m],
                    [b for _, b in m],
                    marker.get(key[1], "D"),
                    color=color,
                    mfc=color if fitted else "none",
                    label=f"{key[0]} ({key[1]})" if fitted else None,
                )
    lo = min(min(a, b) for _, a, b, _ in points)
    hi = max(max(a, b) for _, a, b, _ in points)
    ax1.plot([lo, hi], [lo, hi], "k:")
    ax1.set(
        xlabel="measured s per round",
        ylabel="predicted s per round",
        title="model vs this machine (hollow: P > 1, not fitted)",
    )
    ax1.legend(fontsize=6)
    ranks = [2**k for k in range(int(math.log2(top)) + 1)]
    for key in model.compute:
        if key[1] == "project":
            ax2.loglog(ranks, [sum(model.predict(key, p, clients)) for p in ranks], "-", label=key[0])
    ax2.axvline(top, color="k", ls=":")
    ax2.set(xlabel="ranks", ylabel="predicted s per round", title=f"{clients:,} clients per round")
    ax2.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


OPTIONS = {"nodes": int, "ranks_per_node": int, "clients": int, "alpha": float, "beta": float, "plot": str, "time": str}


def parse(argv: list[str]) -> tuple[str, dict]:
    """(results path, options) of ``RESULTS.h5 [key=value ...]``; ValueError on a bad argument."""
    if not argv or argv[0].startswith("-"):
        raise ValueError("usage: python -m bench.model RESULTS.h5 [" + " ".join(f"{k}=..." for k in OPTIONS) + "]")
    opts = {
        "nodes": 64,
        "ranks_per_node": 64,
        "clients": 1_000_000,
        "alpha": None,
        "beta": None,
        "plot": None,
        "time": "wall",
    }
    for text in argv[1:]:
        key, sep, value = text.partition("=")
        if not sep or key not in OPTIONS:
            raise ValueError(f"unknown argument {text!r}; expected one of " + ", ".join(f"{k}=..." for k in OPTIONS))
        opts[key] = OPTIONS[key](value)
    if opts["time"] not in ("wall", "cpu"):
        raise ValueError(f"time={opts['time']}: expected wall or cpu")
    return argv[0], opts


def main(argv: list[str]) -> int:
    try:
        path, opts = parse(argv)
        attrs, rows = read_bench(path)
    except (OSError, ValueError) as exc:
        print(f"bench.model: {exc}", file=sys.stderr)
        return 2
    network, note = network_of(attrs, opts["alpha"], opts["beta"])
    measure = "alg_s" if opts["time"] == "wall" else "alg_cpu_s"
    model = fit(rows, network, measure)
    if not model.compute:
        print(f"bench.model: {path} has no 1-rank rows to fit", file=sys.stderr)
        return 2
    ranks = opts["nodes"] * opts["ranks_per_node"]
    text, points = report(model, rows, ranks, opts["clients"], note, measure)
    print(text)
    out = Path(opts["plot"]) if opts["plot"] else Path(path).with_name(Path(path).stem + "_model.png")
    plot(model, points, opts["clients"], ranks, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
