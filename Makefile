# fednest-mpi: install, test, bench. See README.md.
PYTHON  ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
MPIEXEC ?= $(BIN)/mpiexec
# every test command runs under a hard time limit, so a deadlock fails instead of hanging
TIMEOUT ?= timeout -k 10 900
MPI_TIMEOUT ?= timeout -k 10 300
export MPI4PY_RC_THREAD_LEVEL ?= single
export OMP_NUM_THREADS ?= 1

.PHONY: install test test-serial test-mpi docs bench clean

install:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .

test: test-serial test-mpi

test-serial:
	$(TIMEOUT) $(BIN)/python -m pytest -q tests

# the MPI tests, on 1, 2 and 4 ranks; each rank runs only @pytest.mark.mpi tests
test-mpi:
	@for n in 1 2 4; do \
	  echo "== MPI tests on $$n ranks"; \
	  $(MPI_TIMEOUT) $(MPIEXEC) -n $$n $(BIN)/python -m pytest -q --only-mpi tests/mpi || exit 1; \
	done

# short benchmark (a few minutes on 2 cores): side-by-side table, bench/results/quick.h5 and plots
bench:
	$(TIMEOUT) $(BIN)/python -m bench bench/quick.toml

docs:
	$(BIN)/fednest-mpi config-doc > docs/config.md

clean:
	rm -rf $(VENV) runs bench/results
	rm -f /dev/shm/mpich_shm_* 2>/dev/null || true
