"""Bad input through the command line: every case exits with code 2 and one message naming the
problem and the fix, without a traceback and without creating the output file.

Table-driven: config values and relations (``BAD_SETTINGS``; tests/unit/test_config.py holds
the other field checks, at the config layer), config files (``BAD_FILES``), output and checkpoint
paths (``BAD_PATHS``), and data files, damaged or missing, or too small for the minibatches
(``BAD_DATA``, a tiny MNIST-format set). Most cases run in-process (``cli.main``); a few run under
``mpiexec -n 2`` to show that every rank agrees and nothing hangs.
"""

import gzip
import os
import shutil
import struct
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch

from fednest_mpi.cli import main

MPIEXEC = Path(sys.executable).parent / "mpiexec"
QUADRATIC = """seed = 1
[problem]
name = "quadratic"
n_clients = 6
dim_x = 2
dim_y = 3
[algorithm]
outer_iterations = 2
clients_per_round = 3
inner_local_steps = 2
"""
IMAGES = """seed = 1
[problem]
name = "{name}"
data_dir = "{data}"
n_clients = 4
partition = "iid"
val_fraction = 0.2
{extra}
[algorithm]
outer_iterations = 1
clients_per_round = 2
inner_local_steps = 2
neumann_steps = 1
"""

# ----------------------------------------------------------------------------------------------
# config values and relations: --set on the small quadratic config (unless the case names a problem)

BAD_SETTINGS = [
    (["sed=2"], "sed: unknown section or field (did you mean 'seed'?)"),
    (["run.outptu='x.h5'"], "run.outptu: unknown field (did you mean 'output'?)"),
    (["federation.reductoin=sum"], "federation.reductoin: unknown field (did you mean 'reduction'?)"),
    (["problem.dimx=3"], "problem.dimx: unknown field (did you mean 'dim_x'?)"),
    (["algorithm.neuman_steps=3"], "algorithm.neuman_steps: unknown field (did you mean 'neumann_steps'?)"),
    (["algorithm.inner_lr=fast"], "algorithm.inner_lr: expected a number, got 'fast'"),
    (["algorithm.inner_lr=-0.1"], "algorithm.inner_lr: must be > 0.0"),
    (["algorithm.outer_lr=inf"], "algorithm.outer_lr: expected a finite number, got inf"),
    (["algorithm.clients_per_round=0"], "algorithm.clients_per_round: must be >= 1"),
    (["algorithm.clients_per_round=7"], "algorithm.clients_per_round: 7 is more than problem.n_clients = 6"),
    (["algorithm.inner_rounds=0"], "algorithm.inner_rounds: must be >= 1"),
    (["algorithm.inner_local_steps=-3"], "algorithm.inner_local_steps: must be >= 1"),
    (["algorithm.outer_local_steps=0"], "algorithm.outer_local_steps: must be >= 1"),
    (["algorithm.neumann_scale=0"], "algorithm.neumann_scale: must be > 0.0"),
    (["algorithm.name=lfednest_svg"], "(did you mean 'lfednest_svrg'?)"),
    (["algorithm.hypergradient=direct"], "algorithm.hypergradient: 'direct' drops the indirect gradient"),
    (["algorithm.name=fedavg_s"], "algorithm.name: 'fedavg_s' is a saddle-point method for problem 'minimax'"),
    (["algorithm.outer_iterations=1e3"], "algorithm.outer_iterations: expected an integer, got 1000.0"),
    (["problem.n_clients=6.0"], "problem.n_clients: expected an integer, got 6.0"),
    (["problem.strong_convexity=0"], "problem.strong_convexity: must be > 0.0"),
    (["problem.gradient_noise=-1"], "problem.gradient_noise: must be >= 0.0"),
    (["problem.outer_regularization=true"], "problem.outer_regularization: expected a number, got True"),
    (["problem.name=minmax"], "problem.name: unknown problem 'minmax' (did you mean 'minimax'?)"),
    (["problem={name='minimax', outer_regularization=0}"], "problem.outer_regularization: must be > 0.0"),
    (["problem={name='minimax', dim_x=3}"], "problem.dim_x: does not apply to problem 'minimax'; it is a field of"),
    (["problem={name='minimax', dim_x=3}"], "remove it (did you mean 'dim'?)"),
    (["problem={name='compositional', dim_x=4, dim_y=2}"], "problem.dim_y: 2 is below problem.dim_x = 4"),
    (["federation.wait=spin"], "federation.wait: 'spin' is not one of 'auto', 'block', 'poll'"),
    (["federation=3"], "federation: expected a table of fields, got 3"),
    (["run.checkpoint_every=-1"], "run.checkpoint_every: must be >= 0"),
    (["run.checkpoint_dir=3"], "run.checkpoint_dir: expected a string, got 3"),
    # a name that TOML reads as a number or a boolean: the line says how to give it as text
    (["run.checkpoint_dir=1e3"], "run.checkpoint_dir: expected a string, got 1000.0; put the text in quotes"),
    (["run.checkpoint_dir=true"], "(on the command line: --set 'run.checkpoint_dir=\"...\"')"),
    # a data folder named with a NUL byte (a TOML escape): stat() raised ValueError, an internal failure (exit 1)
    (
        ['problem={name="hyper_representation", data_dir="a\\u0000b", n_clients=4, partition="iid"}'],
        "data directory 'a\x00b' (from problem.data_dir) holds a NUL byte or a character that no file name can hold",
    ),
    # a line break and more TOML after the value: refused, not dropped unread (the seed would stay 1)
    (["algorithm.outer_lr=0.1\nseed=7"], "--set algorithm.outer_lr: '0.1\\nseed=7' holds more than one value"),
    (['run.output="x.h5"\n[problem]\nn_clients=3'], "holds more than one value (a line break, then 'problem')"),
    (["run.overwrite=yes"], "run.overwrite: expected true or false, got 'yes'"),
    (["run.log_every=0"], "run.log_every: must be >= 1"),
    (["seed=1.5"], "seed: expected an integer, got 1.5"),
]
if not torch.cuda.is_available():
    BAD_SETTINGS.append((["run.device=cuda"], "run.device: 'cuda' was asked for but torch sees no CUDA device"))

# ----------------------------------------------------------------------------------------------
# config files: text of the file (``{dir}`` is its folder), the message

BAD_FILES = [
    ("[algorithm\nname = 1", "is not valid TOML"),
    ('base = "b.toml"\n', "b.toml' does not exist"),
    ('base = "c.toml"\n[problem]\nname = "quadratic"\n', "leads back to itself; remove the cycle"),
    ("base = 3\n", "base: expected the path of a config file, got 3"),
    ("seed = 1\nseed = 2\n", "is not valid TOML"),
    ('[problem]\nname = "quadratic"\nn_clients = "many"\n', "problem.n_clients: expected an integer, got 'many'"),
    ('problem = "quadratic"\n', "problem: expected a table of fields, got 'quadratic'"),
]


# ----------------------------------------------------------------------------------------------
# output and checkpoint paths


def _output_under_a_file(tmp):
    (tmp / "plain").write_text("x")
    return ["--output", str(tmp / "plain" / "out.h5")], "run.output: '" + str(
        tmp / "plain"
    ) + "' is a file, not a folder"


def _output_is_a_folder(tmp):
    (tmp / "folder.h5").mkdir()
    return ["--output", str(tmp / "folder.h5"), "--overwrite"], "run.output: '" + str(
        tmp / "folder.h5"
    ) + "' is a folder"


def _output_is_a_fifo(tmp):  # as /dev/null (a device): never replaced by the run's file (issue 26, finding 1)
    os.mkfifo(tmp / "pipe.h5")
    return ["--output", str(tmp / "pipe.h5"), "--overwrite"], "is not a regular file (a device, FIFO or socket)"


def _output_is_a_symlink(tmp):  # a planted link to another file of the user's
    (tmp / "precious.txt").write_text("keep me")
    (tmp / "link.h5").symlink_to(tmp / "precious.txt")
    return ["--output", str(tmp / "link.h5"), "--overwrite"], "is a symbolic link, which a run never replaces"


def _output_with_a_trailing_slash(tmp):
    return ["--output", f"{tmp}/new.h5/"], "/new.h5/' is a folder; give the path of a file"


def _output_empty(tmp):  # Path("") reads as ".": an empty --output must not degrade to the current folder
    return ["--output", ""], "run.output: the path is empty; give the path of a file"


def _output_ends_in_a_dot(tmp):  # pathlib drops a trailing "/." ("a/." reads as "a")
    return ["--output", f"{tmp}/new/."], "/new/.' is a folder; give the path of a file"


def _output_ends_in_dot_dot(tmp):  # "new/.." was written, then renamed onto a folder at the end
    return ["--output", f"{tmp}/new/.."], "/new/..' is a folder; give the path of a file"


def _output_name_too_long(tmp):
    message = "(325 bytes), over the 255 bytes a file name may have here; shorten"  # the longest derived name
    return ["--output", str(tmp / ("x" * 300 + ".h5"))], message


def _checkpoint_under_a_file(tmp):
    (tmp / "plain").write_text("x")
    return ["--set", f"run.checkpoint_dir='{tmp / 'plain' / 'ck'}'"], "run.checkpoint_dir: '" + str(
        tmp / "plain"
    ) + "' is a file"


def _output_under_a_dangling_link(tmp):  # the lock file could not be made there: "No such file or directory"
    (tmp / "gone").symlink_to(tmp / "nowhere")
    return ["--output", str(tmp / "gone" / "sub" / "out.h5")], f"run.output: '{tmp / 'gone'}' is a symbolic link to"


def _output_under_a_link_loop(tmp):  # was named a damaged lock file, to be removed with rm
    (tmp / "l1").symlink_to(tmp / "l2")
    (tmp / "l2").symlink_to(tmp / "l1")
    return ["--output", str(tmp / "l1" / "out.h5")], f"run.output: '{tmp / 'l1'}' is a symbolic link loop"


def _checkpoint_is_a_dangling_link(tmp):  # was an exception after iteration 0 (FileExistsError), exit 1
    (tmp / "ck").symlink_to(tmp / "nowhere")
    return ["--set", f"run.checkpoint_dir='{tmp / 'ck'}'"], f"run.checkpoint_dir: '{tmp / 'ck'}' is a symbolic link to"


def _disk_full(tmp, monkeypatch):
    monkeypatch.setattr(
        shutil, "disk_usage", lambda path: namedtuple("Usage", "total used free")(10**9, 10**9 - 4096, 4096)
    )
    return [], "is full (4096 bytes free"


def _not_writable(tmp, monkeypatch):
    (tmp / "locked").mkdir()
    monkeypatch.setattr(
        os, "access", lambda path, mode: Path(path) != tmp / "locked"
    )  # as root, chmod would not stop us
    return ["--output", str(tmp / "locked" / "sub" / "out.h5")], "run.output: directory '" + str(
        tmp / "locked"
    ) + "' is not writable"


BAD_PATHS = [
    _output_under_a_file,
    _output_is_a_folder,
    _output_is_a_fifo,
    _output_is_a_symlink,
    _output_with_a_trailing_slash,
    _output_empty,
    _output_ends_in_a_dot,
    _output_ends_in_dot_dot,
    _output_name_too_long,
    _checkpoint_under_a_file,
    _output_under_a_dangling_link,
    _output_under_a_link_loop,
    _checkpoint_is_a_dangling_link,
    _disk_full,
    _not_writable,
]


# ----------------------------------------------------------------------------------------------
# data: a tiny MNIST-format set (200 training, 50 test images), damaged in one way per case


def idx(magic, array):
    array = np.asarray(array, dtype=np.uint8)
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.tobytes()


def write_tiny_mnist(folder, n_train=200, n_test=50):
    folder.mkdir(parents=True, exist_ok=True)
    gen = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        (folder / f"{prefix}-images-idx3-ubyte.gz").write_bytes(
            gzip.compress(idx(2051, gen.integers(0, 256, (n, 28, 28))))
        )
        (folder / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx(2049, np.arange(n) % 10)))
    return folder


def _empty(folder: Path) -> None:
    for path in folder.iterdir():
        path.unlink()


def _replace(folder, make, name="train-labels-idx1-ubyte.gz"):
    """Put what ``make(path)`` creates (a FIFO, folder, link) in place of the data file ``name``."""
    (folder / name).unlink()
    make(folder / name)


def _gz(folder, name, raw):
    (folder / f"{name}.gz").write_bytes(gzip.compress(raw))


BAD_DATA = [
    # (id, damage(folder) -> None, extra problem fields, message)
    ("missing folder", lambda f: shutil.rmtree(f), "", "' (from problem.data_dir) does not exist; fix"),
    ("folder is a FIFO", lambda f: (shutil.rmtree(f), os.mkfifo(f)), "", "' (from problem.data_dir) is a FIFO"),
    ("data file is a FIFO", lambda f: _replace(f, os.mkfifo), "", "train-labels-idx1-ubyte.gz' is a FIFO (named pipe)"),
    ("data file is a folder", lambda f: _replace(f, os.mkdir), "", "train-labels-idx1-ubyte.gz' is a folder"),
    (
        "data file is a device",
        lambda f: _replace(f, lambda p: os.symlink("/dev/zero", p)),
        "",
        "train-labels-idx1-ubyte.gz' is a character device",
    ),
    (
        "data file is a symlink loop",
        lambda f: _replace(f, lambda p: (os.symlink(p.name + ".2", p), os.symlink(p.name, str(p) + ".2"))),
        "",
        "train-labels-idx1-ubyte.gz' is a symbolic link loop",
    ),
    (
        "data file is a dangling link",
        lambda f: _replace(f, lambda p: os.symlink("gone.gz", p)),
        "",
        "train-labels-idx1-ubyte.gz' is a symbolic link to 'gone.gz', which does not exist",
    ),
    (  # data_dir holds no data files but a link named for the data set, to nothing: that link is named
        "data set folder is a dangling link",
        lambda f: (_empty(f), os.symlink("gone", f / "mnist")),
        "",
        "/mnist' is a symbolic link to 'gone', which does not exist, and",
    ),
    (
        "data set folder is a file",
        lambda f: (_empty(f), (f / "mnist").write_text("x")),
        "",
        "/mnist' is a file, not a folder, and",
    ),
    (
        "missing file",
        lambda f: (f / "train-labels-idx1-ubyte.gz").unlink(),
        "",
        "train-labels-idx1-ubyte.gz' not found",
    ),
    (
        "bad magic",
        lambda f: _gz(f, "train-images-idx3-ubyte", idx(2049, np.zeros(5))),
        "",
        "magic number 2049, expected 2051",
    ),
    (
        "labels magic",
        lambda f: _gz(f, "t10k-labels-idx1-ubyte", idx(2051, np.zeros((1, 28, 28)))),
        "",
        "magic number 2051, expected 2049",
    ),
    ("empty file", lambda f: _gz(f, "t10k-images-idx3-ubyte", b""), "", "is empty: 0 bytes once gunzipped"),
    ("empty gz file", lambda f: (f / "t10k-images-idx3-ubyte.gz").write_bytes(b""), "", "is empty (0 bytes); delete"),
    (
        "truncated payload",
        lambda f: _gz(f, "train-images-idx3-ubyte", idx(2051, np.zeros((200, 28, 28)))[:-784]),
        "",
        "is truncated: its header announces shape (200, 28, 28)",
    ),
    (
        "too long",
        lambda f: _gz(f, "train-labels-idx1-ubyte", idx(2049, np.zeros(200)) + b"\0\0"),
        "",
        "is too long: its header announces shape (200,)",
    ),
    (
        "short header",
        lambda f: _gz(f, "train-images-idx3-ubyte", struct.pack(">II", 2051, 200)),
        "",
        "shorter than its 16-byte IDX header",
    ),
    (
        "not gzip",
        lambda f: (f / "train-labels-idx1-ubyte.gz").write_bytes(b"plain bytes"),
        "",
        "is not a valid gzip file",
    ),
    (
        "cut gzip",
        lambda f: (f / "t10k-images-idx3-ubyte.gz").write_bytes((f / "t10k-images-idx3-ubyte.gz").read_bytes()[:-40]),
        "",
        "is not a valid gzip file",
    ),
    (
        "label out of range",
        lambda f: _gz(f, "train-labels-idx1-ubyte", idx(2049, np.full(200, 11))),
        "",
        "has label 11 at index 0; labels must be in 0..9",
    ),
    ("count mismatch", lambda f: _gz(f, "t10k-labels-idx1-ubyte", idx(2049, np.zeros(49))), "", "holds 50 images but"),
    (
        "wrong image size",
        lambda f: _gz(f, "t10k-images-idx3-ubyte", idx(2051, np.zeros((50, 14, 14)))),
        "",
        "holds images of 14x14 pixels, expected 28x28",
    ),
    (
        "md5 mismatch",
        lambda f: (f / "MD5SUMS").write_text("0" * 32 + "  train-labels-idx1-ubyte.gz\n"),
        "",
        "a file replaced on purpose: delete its line from",
    ),
    ("bad MD5SUMS", lambda f: (f / "MD5SUMS").write_text("not a checksum line\n"), "", "is not `MD5  FILENAME`"),
    (
        "batch > smallest client",
        lambda f: None,
        "batch_size = 41",
        "problem.batch_size: 41 is more than the 40 inner (training) samples of the smallest client",
    ),
    (
        "hypergradient batch > smallest client",
        lambda f: None,
        "batch_size = 8\nhypergradient_batch_size = 11",
        "problem.hypergradient_batch_size: 11 is more than the 10 outer (validation) samples",
    ),
    (
        "loss tuning, missing file",
        lambda f: (f / "t10k-images-idx3-ubyte.gz").unlink(),
        "loss_tuning",
        "t10k-images-idx3-ubyte.gz' not found",
    ),
]


def _image_config(tmp, data, extra):
    name = "loss_tuning" if extra == "loss_tuning" else "hyper_representation"
    path = tmp / "images.toml"
    path.write_text(
        IMAGES.format(name=name, data=data, extra="batch_size = 8" if extra in ("", "loss_tuning") else extra)
    )
    return path


# ----------------------------------------------------------------------------------------------


def run_main(capsys, *args):
    code = main(["run", *map(str, args), "-q"])
    captured = capsys.readouterr()
    return code, captured.err


def assert_usage_error(code, err, message, output):
    assert code == 2, err
    assert message in err, err
    assert err.count("fednest-mpi: error:") == 1 and "Traceback" not in err
    assert not Path(output).exists()


def test_the_table_has_at_least_50_cases():
    assert len(BAD_SETTINGS) + len(BAD_FILES) + len(BAD_PATHS) + len(BAD_DATA) >= 50


@pytest.mark.parametrize("overrides,message", BAD_SETTINGS, ids=[m[:50] for _, m in BAD_SETTINGS])
def test_bad_setting(tmp_path, capsys, overrides, message):
    cfg = tmp_path / "q.toml"
    cfg.write_text(QUADRATIC)
    sets = [arg for o in overrides for arg in ("--set", o)]
    code, err = run_main(capsys, cfg, "--output", tmp_path / "out.h5", *sets)
    assert_usage_error(code, err, message, tmp_path / "out.h5")


@pytest.mark.parametrize("text,message", BAD_FILES, ids=[m[:50] for _, m in BAD_FILES])
def test_bad_config_file(tmp_path, capsys, text, message):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    code, err = run_main(capsys, cfg, "--output", tmp_path / "out.h5")
    assert_usage_error(code, err, message, tmp_path / "out.h5")


@pytest.mark.parametrize("case", BAD_PATHS, ids=[c.__name__ for c in BAD_PATHS])
def test_bad_path(tmp_path, capsys, monkeypatch, case):
    cfg = tmp_path / "q.toml"
    cfg.write_text(QUADRATIC + f'[run]\noutput = "{tmp_path / "default.h5"}"\n')
    args, message = case(tmp_path, monkeypatch) if case in (_disk_full, _not_writable) else case(tmp_path)
    code, err = run_main(capsys, cfg, *args)
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "default.h5").exists()
    if case is _output_is_a_symlink:
        assert (tmp_path / "precious.txt").read_text() == "keep me" and (tmp_path / "link.h5").is_symlink()
    if case is _output_is_a_fifo:
        assert (tmp_path / "pipe.h5").is_fifo()
    assert not (tmp_path / "new").exists()


def test_an_empty_path_is_refused_not_read_as_the_current_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.h5").write_bytes(b"")  # a (damaged) run file in the current folder: '' must not read it
    cases = {
        "a run path is empty": (["report", ""], ["report", "run.h5", ""], ["plot", "", "-o", "p.png"]),
        "the config file's path is empty": (["run", "", "--output", "out.h5"],),
    }
    for message, commands in cases.items():
        for command in commands:
            assert main(command) == 2, command
            err = capsys.readouterr().err
            assert err.count("fednest-mpi: error:") == 1 and message in err, err
    assert not (tmp_path / "out.h5").exists()


@pytest.mark.parametrize("name,damage,extra,message", BAD_DATA, ids=[c[0] for c in BAD_DATA])
def test_bad_data(tmp_path, capsys, name, damage, extra, message):
    data = write_tiny_mnist(tmp_path / "mnist")
    damage(data)
    code, err = run_main(capsys, _image_config(tmp_path, data, extra), "--output", tmp_path / "out.h5")
    assert_usage_error(code, err, message, tmp_path / "out.h5")


def test_the_tiny_data_set_itself_is_good(tmp_path, capsys):
    """The control of BAD_DATA: undamaged, the same config runs."""
    data = write_tiny_mnist(tmp_path / "mnist")
    code, err = run_main(capsys, _image_config(tmp_path, data, "batch_size = 40"), "--output", tmp_path / "out.h5")
    assert code == 0, err


# ----------------------------------------------------------------------------------------------
# the same under mpiexec: every rank reaches the verdict, one message, no hang


def run_mpi(*args, ranks=2):
    env = {**os.environ, "MPI4PY_RC_THREAD_LEVEL": "single", "OMP_NUM_THREADS": "1"}
    cmd = [str(MPIEXEC), "-n", str(ranks), sys.executable, "-m", "fednest_mpi", "run", *map(str, args), "-q"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.processes  # starts mpiexec: make test-processes
@pytest.mark.parametrize("case", ["missing file", "batch > smallest client"])
def test_data_errors_agree_on_every_rank(tmp_path, case):
    name, damage, extra, message = next(c for c in BAD_DATA if c[0] == case)
    data = write_tiny_mnist(tmp_path / "mnist")
    damage(data)
    res = run_mpi(_image_config(tmp_path, data, extra), "--output", tmp_path / "out.h5")
    assert_usage_error(res.returncode, res.stderr, message, tmp_path / "out.h5")


@pytest.mark.processes  # starts mpiexec: make test-processes
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_error_while_building_agrees_on_every_rank(tmp_path):
    cfg = tmp_path / "q.toml"
    cfg.write_text(QUADRATIC)
    res = run_mpi(cfg, "--output", tmp_path / "out.h5", "--set", "run.device=cuda")
    assert_usage_error(res.returncode, res.stderr, "run.device: 'cuda' was asked for", tmp_path / "out.h5")
