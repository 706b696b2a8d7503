"""``run.check_consistency``: do all ranks hold the same iterates (x, y)?

Every rank must hold the same x and y after each outer iteration of Algorithm 1 (the server's
update is computed from the same aggregates on every rank). A plugin that computes something
rank-dependent (a draw from a global generator, data or state of its own rank) breaks that without
any other sign. Every ``run.check_consistency`` iterations each rank reduces a 64-bit digest of the
bytes of x and y to :func:`moments` (sums and sums of squares of its four 16-bit pieces), which
ride in the runner's per-iteration bookkeeping reduction (:class:`fednest_mpi.runner.Bookkeeping`,
a SUM through ``Federation.bookkeeping_sum``: no collective of its own, uncounted); :func:`agree`
reads from the sums whether every rank's digest was the same (n sum p^2 = (sum p)^2 holds exactly
iff all n pieces p are equal: the equality case of Cauchy-Schwarz). Only when they differ does the
runner gather the digests (:func:`fednest_mpi.runner.refuse_disagreement`) to name the ranks.
No MPI here.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

PIECES = 4  # 16-bit pieces of the 64-bit digest: their sums of squares stay exact in float64 up to 2**21 ranks
PIECE_BITS = 16


def digest(x: torch.Tensor, y: torch.Tensor) -> int:
    """A 64-bit digest of the bytes of ``x`` and ``y`` (moved to the CPU): the first 8 bytes of their SHA-1, not
    for security (the fastest of hashlib's here: 4 ms for 8 MB, BLAKE2b 8 ms, on the 2-core AMD EPYC, loaded)."""
    h = hashlib.sha1(usedforsecurity=False)
    for t in (x, y):
        h.update(t.detach().contiguous().cpu().numpy().data)  # the buffer itself, not a copy
    return int.from_bytes(h.digest()[:8], "little")


def moments(value: int) -> np.ndarray:
    """The float64 numbers a rank adds to the bookkeeping SUM for its digest ``value``: its 16-bit
    pieces, then their squares (integers, exact in any order of addition)."""
    pieces = [(value >> (PIECE_BITS * i)) & (2**PIECE_BITS - 1) for i in range(PIECES)]
    return np.array(pieces + [p * p for p in pieces], dtype=np.float64)


def agree(summed: np.ndarray, size: int) -> bool:
    """True when the SUM over ``size`` ranks of :func:`moments` comes from one digest on every rank."""
    first, second = summed[:PIECES], summed[PIECES:]
    return all(size * int(s2) == int(s1) ** 2 for s1, s2 in zip(first, second))


def disagreement(k: int, digests: list[int], every: int, agreed: int | None) -> str:
    """The one line of ranks whose ``digests`` (one per rank) differ at iteration ``k``, checked every
    ``every`` iterations, last found equal at iteration ``agreed`` (None: not in this run)."""
    others = [rank for rank, d in enumerate(digests) if d != digests[0]]
    named = ", ".join(map(str, others[:8])) + (f" and {len(others) - 8} more" if len(others) > 8 else "")
    who = f"rank {named} differs" if len(others) == 1 else f"ranks {named} differ"
    since = ""
    if every > 1:
        since = f"; checked every {every} iterations" + (f", equal at iteration {agreed}" if agreed is not None else "")
    return (
        f"run.check_consistency: x and y differ between ranks at iteration {k} ({who} from rank 0{since}): a plugin "
        "computed something rank-dependent (randomness outside the keyed streams sample.key / rng.key, data or "
        "state of its own rank); `fednest-mpi check CONFIG` compares its runs on 1 and 2 ranks"
    )
