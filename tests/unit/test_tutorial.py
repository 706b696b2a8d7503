"""docs/tutorial.md runs as written: its shell commands are, in order, the commands of examples/tutorial/tutorial.sh,
which this test runs from a fresh folder (every step of the tutorial, `mpiexec -n 2` included: 36-48 s on 2 busy cores);
every line of its Python and TOML blocks is a line of a file of examples/tutorial/; and what it quotes of the output
is what the script prints. The tutorial's problem: its oracles against autograd, its closed-form solution."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fednest_mpi.api import read_run

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = (ROOT / "docs" / "tutorial.md").read_text()
FOLDER = ROOT / "examples" / "tutorial"
SCRIPT = FOLDER / "tutorial.sh"
SET_UP = ("make install", "source .venv/bin/activate")  # the tutorial's set-up, which the test's venv has done


def _blocks(language: str) -> list[str]:
    """The fenced code blocks of the tutorial in ``language`` ("" for the blocks of program output)."""
    blocks: list[str] = []
    inside, lines = False, None  # lines: the block's lines when it is in ``language``, else None
    for line in TUTORIAL.splitlines():
        if line.startswith("```"):
            if inside and lines is not None:
                blocks.append("\n".join(lines))
            inside, lines = not inside, ([] if not inside and line[3:] == language else None)
        elif lines is not None:
            lines.append(line)
    return blocks


def _doc_commands() -> list[str]:
    """Every command line of the tutorial's bash blocks, without its trailing comment."""
    lines = (line.split("  #")[0].strip() for block in _blocks("bash") for line in block.splitlines())
    return [line for line in lines if line]


def _script_commands() -> list[str]:
    """The commands of tutorial.sh; ``if COMMAND; then`` counts as COMMAND (a run expected to fail)."""
    commands = []
    for line in SCRIPT.read_text().splitlines():
        line = line.strip()
        if line.startswith("if ") and line.endswith("; then"):
            line = line[3 : -len("; then")]
        commands.append(line)
    return commands


def test_the_tutorials_commands_are_its_scripts_in_order():
    doc = [c for c in _doc_commands() if c not in SET_UP]
    script = _script_commands()
    missing = [c for c in doc if c not in script]
    assert not missing, f"commands of docs/tutorial.md not in {SCRIPT.name}: {missing}"
    positions = [script.index(c) for c in doc]
    assert positions == sorted(positions), "docs/tutorial.md runs its commands in another order than tutorial.sh"


def test_every_code_line_of_the_tutorial_is_a_line_of_its_files():
    for language, pattern in (("python", "*.py"), ("toml", "*.toml")):
        lines = {line.rstrip() for path in FOLDER.glob(pattern) for line in path.read_text().splitlines()}
        blocks = _blocks(language)
        assert blocks, language
        for block in blocks:
            for line in block.splitlines():
                if line.strip() not in ("", "..."):
                    assert line.rstrip() in lines, f"docs/tutorial.md ({language}): {line!r} is in no {pattern} file"


@pytest.mark.processes  # starts mpiexec: make test-processes
@pytest.mark.slow
def test_the_tutorial_runs_and_prints_what_it_quotes(tmp_path):
    for folder in ("configs", "examples"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]

    for block in _blocks(""):  # the output the tutorial shows, without the time of day, wall time and rate
        for line in block.splitlines():
            assert re.sub(r"^\d\d:\d\d:\d\d ", "", line).split(" wall=")[0] in output, line
    # the value the tutorial quotes, printed in full: equal to the last digits that the CPU class decides
    line = re.compile(r"x_error after iteration 10: (\S+) after 350\.0 rounds")
    quoted, printed = line.search(TUTORIAL), line.search(output)
    assert quoted and printed, "the tutorial's step 3 line is not in the tutorial or not in the output"
    assert float(printed[1]) == pytest.approx(float(quoted[1]), rel=1e-13, abs=0)

    runs = tmp_path / "runs"
    one, two = (read_run(runs / "tutorial" / name)[1] for name in ("quadratic.h5", "quadratic_2ranks.h5"))
    np.testing.assert_array_equal(one["x_error"], two["x_error"])  # "the two runs give the same bits"
    assert f"x_error={one['x_error'][-1]:.4g}" == "x_error=0.02031" and "x_error=0.02031" in TUTORIAL
    shrinkage, clip = (read_run(runs / "tutorial" / name)[1] for name in ("shrinkage.h5", "clip.h5"))
    measured = (
        f"falls from {shrinkage['x_error'][0]:.4g} to {shrinkage['x_error'][10]:.1e} after 10 iterations and to "
        f"{shrinkage['x_error'][20]:.1e} after 20",
        f"falls to {clip['x_error'][20]:.1e} after 20 iterations and {clip['x_error'][30]:.1e} after 30",
    )
    for text in measured:
        assert text in " ".join(TUTORIAL.split()), text
    rounds = [clip["comm_rounds"][1], shrinkage["comm_rounds"][1]]
    assert rounds == [14, 15] and "14 rounds per iteration\ninstead of FedNest's 15" in TUTORIAL
    assert (runs / "tutorial" / "quadratic.png").stat().st_size > 0
    assert (runs / "jobs" / "tutorial_slurm" / "tutorial_sweep.array.sbatch").is_file()
    assert sorted(p.name for p in (runs / "tutorial" / "sweep").glob("*.h5")) == ["clip0.25.h5", "clip0.5.h5"]


def test_the_tutorials_problem_has_the_oracles_and_the_solution_it_states():
    sys.path.insert(0, str(FOLDER))
    try:
        from tutorial_shrinkage import Shrinkage
    finally:
        sys.path.remove(str(FOLDER))
    cfg = Shrinkage.Params(n_clients=6, dim=4)
    hosted, whole = Shrinkage(cfg, 3, range(2, 5)), Shrinkage(cfg, 3, range(6))
    torch.testing.assert_close(hosted.a, whole.a[2:5], rtol=0, atol=0)  # a client's targets: the same on any rank
    gen = torch.Generator().manual_seed(0)
    ids = np.array([4, 2])
    X, Y, V = (torch.randn(2, 4, dtype=torch.float64, generator=gen) for _ in range(3))
    for b, i in enumerate(ids):
        x, y = X[b].clone().requires_grad_(), Y[b].clone().requires_grad_()
        f = 0.5 * ((y - whole.b[i]) ** 2).sum()
        g = 0.5 * ((y - whole.a[i]) ** 2).sum() + 0.5 * (torch.exp(x) * y * y).sum()
        (fy,) = torch.autograd.grad(f, y)
        (gy,) = torch.autograd.grad(g, y, create_graph=True)
        hvp, jvp = torch.autograd.grad(gy @ V[b], (y, x))
        want = {"grad_y_outer": fy, "grad_y_inner": gy.detach(), "hvp_yy_inner": hvp, "jvp_xy_inner": jvp}
        got = {
            "grad_x_outer": hosted.grad_x_outer(ids, X, Y, None)[b],
            "grad_y_outer": hosted.grad_y_outer(ids, X, Y, None)[b],
            "grad_y_inner": hosted.grad_y_inner(ids, X, Y, None)[b],
            "hvp_yy_inner": hosted.hvp_yy_inner(ids, X, Y, V, None)[b],
            "jvp_xy_inner": hosted.jvp_xy_inner(ids, X, Y, V, None)[b],
        }
        assert not got["grad_x_outer"].any()
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=1e-12, atol=1e-12, msg=name)
    # y*(x*) = abar / (1 + exp(x*)) is bbar, the minimiser of the mean of the f_i
    y_at_x_star = whole.a.mean(0) / (1 + torch.exp(whole.x_star))
    torch.testing.assert_close(y_at_x_star, whole.b.mean(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(whole.y_star, whole.b.mean(0), rtol=0, atol=0)
