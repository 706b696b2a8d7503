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

# before torch or numpy initialise their math libraries: the default numerical mode (docs/design.md)
_numerics.set_environment(_numerics.environment_mode())
