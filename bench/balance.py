"""How uneven block placement is: ``python bench/balance.py [rounds]``.

With block placement (contiguous blocks of client ids, ``federation.placement = "block"``) and
uniform sampling of |S| of M clients, the number of a round's participants on a rank is
hypergeometric: mean |S|/P, so the round waits for the rank with the most. This script draws the
client sets exactly as a run does (:meth:`fednest_mpi.federation.Federation.sample`'s key
streams) and prints, per (M, |S|, P), the mean over rounds of max_r n_r / (|S|/P) -- the slow-down
of a round against a perfect split when work is proportional to clients -- and the efficiency
bound (|S|/P) / max_r n_r. Balanced placement makes max_r n_r = ceil(|S|/P) by construction.
No MPI.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fednest_mpi import rng  # noqa: E402
from fednest_mpi.federation import block_range  # noqa: E402

CASES = [
    (100, 10, 2),
    (100, 10, 4),
    (1000, 100, 2),
    (1000, 100, 4),
    (1000, 100, 16),
    (10000, 1600, 16),
    (100000, 1600, 16),
    (100000, 10000, 16),
]


def imbalance(n_clients: int, per_round: int, ranks: int, rounds: int, seed: int = 0) -> tuple[float, float, float]:
    """(mean max/mean load, mean efficiency bound, share of rounds with an idle rank) under block placement."""
    edges = np.array([block_range(n_clients, ranks, r).start for r in range(ranks)] + [n_clients])
    ratios, idle = [], 0
    for k in range(rounds):
        ids = rng.sample_without_replacement(rng.key(seed, int(rng.Purpose.OUTER_CLIENTS), k), n_clients, per_round)
        counts = np.histogram(ids, bins=edges)[0]
        ratios.append(counts.max() / (per_round / ranks))
        idle += bool((counts == 0).any())
    ratios = np.array(ratios)
    return float(ratios.mean()), float((1 / ratios).mean()), idle / rounds


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 2000
    print(
        f"block placement, {rounds} rounds each; balanced placement: max/mean = ceil(|S|/P)/(|S|/P), efficiency bound 1"
    )
    print(f"{'M':>8} {'|S|':>6} {'P':>3} {'max/mean':>9} {'eff. bound':>10} {'idle rank':>9} {'balanced max/mean':>17}")
    for m, s, p in CASES:
        ratio, eff, idle = imbalance(m, s, p, rounds)
        print(f"{m:>8} {s:>6} {p:>3} {ratio:>9.3f} {eff:>10.3f} {100 * idle:>8.1f}% {-(-s // p) / (s / p):>17.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
