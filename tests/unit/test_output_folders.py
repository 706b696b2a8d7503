"""A run may write into a folder that does not exist yet: the output's lock, file, client files and
checkpoint are created there (the SLURM templates and the workstation runner rely on it)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_creates_its_output_folder(tmp_path):
    out = tmp_path / "new" / "deeper" / "run.h5"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fednest_mpi",
            "run",
            str(ROOT / "configs" / "quadratic.toml"),
            "-q",
            "--set",
            "algorithm.outer_iterations=2",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert out.is_file() and not Path(str(out) + ".lock").exists()  # the lock is released at the end
