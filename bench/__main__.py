"""``python -m bench SPEC.toml [key=value ...]``: see :mod:`bench.run`."""

import sys

from bench.run import main

sys.exit(main(sys.argv[1:]))
