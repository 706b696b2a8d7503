"""fednest-mpi: an MPI simulator for federated bilevel, minimax and compositional optimisation.

The package is layered, lowest first (see ``docs/design.md``). A module imports from its own layer and the
layers listed before it only; ``tests/unit/test_layers.py`` reads the source and holds every module to it.

1. base   -- helpers every layer shares: errors, text, pathkind, atomic, logs, stop, allocator, lock, native
   (small C libraries compiled on first use), failure, registry, numerics, exactsum, rng, consistency, memory,
   callbacks and comm
   (:mod:`fednest_mpi.comm`, the only importer of mpi4py; nothing starts MPI at import).
2. config -- :mod:`fednest_mpi.config`: parameter classes, registries, loading and validation; pure data.
3. io     -- :mod:`fednest_mpi.io`: run files and data-set files; the only place that imports h5py.
4. data   -- :mod:`fednest_mpi.data`: the data sets, their download and their partition over clients.
5. core   -- :mod:`fednest_mpi.problems` (per-client oracles on flat vectors, batched over a block of
   clients; imports nothing of algorithms or federation), :mod:`fednest_mpi.federation` (placement of clients
   on ranks, client sampling, the counted ``Allreduce`` aggregation), heterogeneity, recorder,
   :mod:`fednest_mpi.algorithms` (the FedNest family written once against those two primitives) and
   contract (the plugin boundary). Problems and algorithms import neither comm nor mpi4py.
6. run    -- runner, checkpoint, series, session, checking and writers: a run to its files (writers: to
   TensorBoard and MLflow, whose packages are extras imported only when a writer is built).
7. api    -- :mod:`fednest_mpi.api` (the curated public names) and apidoc (its reference).
8. cli    -- :mod:`fednest_mpi.cli` and ``__main__``: the only place that parses command lines (argparse).

Two side layers stand on base, config and io alone, and only cli imports them:
:mod:`fednest_mpi.post` (run files to DataFrames, reports and plots; nothing of the run path) and
:mod:`fednest_mpi.jobs` (site files, sweeps and their SLURM scripts).

MPI collectives are called in four modules, each for one purpose: federation (the algorithms' counted
rounds and the bookkeeping reduction: ``Allreduce``, ``Iallreduce``; a ``Barrier`` before the ranks'
common clock), runner (agreements
outside the counted rounds: a usage error found on some ranks, the CPU classes, the ranks whose digests
differ: ``allgather``, ``bcast``), checkpoint (the files each rank wrote, gathered to rank 0, then a
``Barrier``: ``gather``, ``Barrier``) and session (``Abort`` of the whole job after a failure on one rank).
"""

__version__ = "0.1.0"

from fednest_mpi import numerics as _numerics

# torch imported first: MKL's strict mode now, before the program's first torch computation can fix MKL's
# mode (a library call; the environment is left as it is). Each run does it too (docs/design.md).
_numerics.prepare_at_import()
