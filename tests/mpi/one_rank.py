"""The 1-rank reference run of a rank-count test, made once: on rank 0 (``COMM_SELF``), sent to every rank."""

from mpi4py import MPI

from fednest_mpi.runner import simulate


def simulate_on_one_rank(cfg):
    """``simulate(cfg, MPI.COMM_SELF)`` on rank 0 only, its result (or the exception it raised) broadcast to every
    rank. Every rank then compares its ``COMM_WORLD`` run with the same reference; the N identical copies that
    every rank used to compute (N ranks sharing the cores: 1.5 references' time on 3 ranks and 2 cores) become
    one. An exception is raised on every rank, so that none waits for ever in the broadcast."""
    comm = MPI.COMM_WORLD
    outcome = None
    if comm.rank == 0:
        try:
            outcome = (simulate(cfg, MPI.COMM_SELF), None)
        except Exception as error:  # re-raised on every rank below
            outcome = (None, error)
    result, error = comm.bcast(outcome, root=0)
    if error is not None:
        raise error
    return result
