# fednest-mpi: install, test, bench. See README.md.
PYTHON  ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
MPIEXEC ?= $(BIN)/mpiexec
# every test command runs under a hard time limit, so a deadlock fails instead of hanging
TIMEOUT ?= timeout -k 10 1800
MPI_TIMEOUT ?= timeout -k 10 900
export MPI4PY_RC_THREAD_LEVEL ?= single
export OMP_NUM_THREADS ?= 1

.PHONY: install test lint test-unit test-processes test-serial test-mpi test-examples docs bench invariance clean \
	install-openmpi test-openmpi test-cluster

install:
	@echo "== make install: a virtual environment in $(VENV) ($(PYTHON) -m venv)"
	$(PYTHON) -m venv $(VENV)
	@echo "== the pinned packages of requirements.txt (torch, mpi4py + MPICH, h5py, ...: the longest step)"
	$(BIN)/pip install --progress-bar off --disable-pip-version-check -r requirements.txt
	@echo "== the optional writers' packages of requirements-writers.txt (tensorboard, mlflow-skinny), so that their \
	tests run: about 45 s more on a loaded 2-core machine"
	$(BIN)/pip install --progress-bar off --disable-pip-version-check --no-compile -r requirements-writers.txt
	@echo "== fednest-mpi itself, editable (pip install -e .)"
	$(BIN)/pip install -q --no-deps -e .
	@echo "== done: $(BIN)/fednest-mpi --version: $$($(BIN)/fednest-mpi --version); next: make test"

test: lint test-serial test-mpi

# ruff (lint, import order; line length 120) and mypy on the package (pyproject.toml)
lint:
	$(BIN)/ruff check src tests bench jobs
	$(BIN)/mypy

# pytest-xdist workers of the two pytest tiers below: one per core (PYTEST_WORKERS=0: one process, no xdist).
# Every test there is independent (tmp_path, no fixed paths; the exact-sum kernel's cache is written by rename).
PYTEST_WORKERS ?= $(shell nproc 2> /dev/null || echo 2)
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS))

# the unit tier: every test that runs in the pytest process (and plain `python -m fednest_mpi` children), no
# mpiexec, no wheel builds; tests/conftest.py fails a test that starts mpiexec without the `processes` mark
test-unit:
	$(TIMEOUT) $(BIN)/python -m pytest -q $(XDIST) -m "not packaging and not processes" tests

# the tests that start fresh MPI jobs (mpiexec -n 2 of the command line: signals, faults, resume, the tutorial)
test-processes:
	$(TIMEOUT) $(BIN)/python -m pytest -q $(XDIST) -m "processes and not packaging" tests

# both tiers in ONE pytest-xdist session (what make test runs): every test but the MPI-marked ones (skipped
# without mpiexec) and the wheel builds (test-examples runs those). One start-up and one tail instead of two: the
# long tests (@pytest.mark.slow, mostly the processes tier) go first, the short unit tests fill the workers' ends.
test-serial:
	$(TIMEOUT) $(BIN)/python -m pytest -q $(XDIST) -m "not packaging" tests

# the MPI tests on 2 and 3 ranks; each rank runs only @pytest.mark.mpi tests. Not on 1 rank by default: the
# tests compare COMM_WORLD with runs on COMM_SELF (1 rank) inside the same job, or check what only several
# ranks have, and test-serial runs the command line without mpiexec (a 1-rank COMM_WORLD); MPI_RANKS="1 2 3"
# adds the 1-rank pass. 3 rather than 4: with 2, an even and an uneven split of the clients, a power of two
# and not (MPICH's Allreduce takes another path), more ranks than cores (4 took 178 s against 167 s for 3 on 2
# quiet cores; the 4 -> 2 resumes run in test-processes; MPI_RANKS="2 3 4" runs all three). The first count
# runs every MPI test; the later ones leave out @pytest.mark.problem_invariance (one problem's oracles on its
# data, chunk- and rank-count invariant through the same block split that the quadratic tests check at every
# count): 183 s -> about 55 s for the 3-rank pass on this 2-core Intel Xeon (docs/testing.md).
MPI_RANKS ?= 2 3
test-mpi:
	@first=1; for n in $(MPI_RANKS); do \
	  if [ $$first = 1 ]; then only="mpi"; else only="mpi and not problem_invariance"; fi; first=0; \
	  echo "== MPI tests on $$n ranks (-m '$$only')"; \
	  $(MPI_TIMEOUT) $(MPIEXEC) -n $$n $(BIN)/python -m pytest -q --only-mpi -m "$$only" tests/mpi || exit 1; \
	done

# the packaging tests (a wheel built offline and installed outside the tree), then the examples as a user
# runs them: wheel + example packages in a fresh venv, run outside the tree under mpiexec -n 2, and a
# rendered sweep over a plugin
test-examples:
	$(TIMEOUT) $(BIN)/python -m pytest -q -m packaging tests/unit
	$(TIMEOUT) bash jobs/ci/examples.sh

# ---- a second MPI: mpi4py built from source against Debian's Open MPI, in its own venv, as
# docs/install.md tells cluster users (apt-get when the library is absent and we are root)
OMPI_VENV ?= .venv-openmpi
OMPI_BIN  := $(OMPI_VENV)/bin
OMPI_MPICC  ?= /usr/bin/mpicc.openmpi
OMPI_MPIRUN ?= /usr/bin/mpirun.openmpi
# appended to Python's -O3: mpi4py's one large C file then compiles in a fraction of the time
# (14.7 min at -O3 on the 2 busy cores here); the tests do not measure speed. Empty: as users build.
MPI4PY_CFLAGS ?= -O0
# Open MPI refuses to start as root without these; on a 2-core machine 4 ranks need --oversubscribe
OMPI_ENV := $(if $(filter 0,$(shell id -u)),OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)

install-openmpi:
	@if [ ! -x $(OMPI_MPICC) ] || [ ! -x $(OMPI_MPIRUN) ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "install-openmpi: $(OMPI_MPICC) missing: apt-get install libopenmpi-dev openmpi-bin (as root)" >&2; exit 1; fi; \
	  echo "== apt-get install libopenmpi-dev openmpi-bin"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    libopenmpi-dev openmpi-bin > /dev/null || exit 1; \
	fi
	$(PYTHON) -m venv $(OMPI_VENV)
	$(OMPI_BIN)/pip install -q -U pip "setuptools>=77" wheel
	MPICC=$(OMPI_MPICC) CFLAGS="$(MPI4PY_CFLAGS)" $(OMPI_BIN)/pip install -q --no-cache-dir --no-binary=mpi4py \
	  $$(grep '^mpi4py==' requirements.txt)
	grep -v -E '^(mpi4py|mpich)' requirements.txt > $(OMPI_VENV)/requirements.txt
	$(OMPI_BIN)/pip install -q -r $(OMPI_VENV)/requirements.txt
	$(OMPI_BIN)/pip install -q --no-deps -e .
	$(OMPI_BIN)/python -c "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"

# the MPI tests under Open MPI, on OMPI_RANKS ranks. One rank count: this pass checks that mpi4py built against
# another MPI library runs every collective, point-to-point and abort path the tests use, which 2 ranks already
# reach; what depends on the rank count (uneven client splits, more ranks than cores, N -> N/2 resumes) is the
# same Python code under either library and runs under MPICH at every count of MPI_RANKS. The 2- and 4-rank
# passes took 339 s together (2-core AMD EPYC, quiet; under MPICH the 4-rank pass was 184 of 280 s).
# OMPI_RANKS="2 4": both, as before.
OMPI_RANKS ?= 2
test-openmpi:
	@for n in $(OMPI_RANKS); do \
	  echo "== MPI tests on $$n ranks (Open MPI)"; \
	  $(OMPI_ENV) $(MPI_TIMEOUT) $(OMPI_MPIRUN) --oversubscribe -n $$n \
	    $(OMPI_BIN)/python -m pytest -q --only-mpi tests/mpi || exit 1; \
	done

# the live-SLURM tests (tests/cluster): a throw-away one-node SLURM up, the tests, SLURM down
test-cluster:
	@dir=$$(bash jobs/ci/slurm.sh up) || exit 1; \
	SLURM_CONF=$$dir/slurm.conf FEDNEST_VENV=$(abspath $(VENV)) $(TIMEOUT) $(BIN)/python -m pytest -q -m cluster tests/cluster; \
	rc=$$?; bash jobs/ci/slurm.sh down "$$dir" || rc=1; exit $$rc

# short benchmark (a few minutes on 2 cores): side-by-side table, bench/results/quick.h5 and plots
bench:
	$(TIMEOUT) $(BIN)/python -m bench bench/quick.toml

# every shipped config: bitwise the same for chunk sizes 1, 7 and automatic on RANKS ranks as on one (4.5 min on 2 cores)
RANKS ?= 2
invariance:
	timeout -k 10 3600 $(MPIEXEC) -n $(RANKS) $(BIN)/python bench/invariance.py $$(find configs -name '*.toml' | sort)

docs:
	$(BIN)/fednest-mpi config-doc --builtin > docs/config.md   # without the plugins installed here

clean:
	rm -rf $(VENV) runs bench/results
	rm -f /dev/shm/mpich_shm_* 2>/dev/null || true
