"""``python -m fednest_mpi`` is the same as the ``fednest-mpi`` command."""

import sys

from fednest_mpi.cli import main

sys.exit(main())
