"""fednest-mpi: an MPI simulator for federated bilevel, minimax and compositional optimisation.

The package is layered (see ``docs/design.md``):

* :mod:`fednest_mpi.problems`  -- per-client oracles on flat vectors, batched over a block of clients; no MPI.
* :mod:`fednest_mpi.federation` -- placement of clients on ranks, client sampling, and the counted
  ``Allreduce`` aggregation; the only module that talks to MPI collectives.
* :mod:`fednest_mpi.algorithms` -- FedNest family written once against those two primitives.
* :mod:`fednest_mpi.io`         -- the only place that touches HDF5.
* :mod:`fednest_mpi.post`       -- post-processing of run files (DataFrames, reports, plots); imports
  nothing of the run path, which never imports it.
* :mod:`fednest_mpi.cli`        -- the only place that parses command lines.
"""

__version__ = "0.1.0"

from fednest_mpi import numerics as _numerics

# torch imported first: MKL's strict mode now, before the program's first torch computation can fix MKL's
# mode (a library call; the environment is left as it is). Each run does it too (docs/design.md).
_numerics.prepare_at_import()
