"""A path is a path: whatever bytes a shell passes as --output, --set run.output=... or a config path,
the run's files land exactly there, or it stops with exit 2 and one line before any collective
(docs/reliability.md)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fednest_mpi import config
from fednest_mpi.config.loading import parse_override
from fednest_mpi.errors import ConfigError, UsageError
from fednest_mpi.io.h5 import check_names, derived_paths, read_run

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "quadratic.toml"
NAME_MAX = 255
# the longest derived name is the temporary file ".NAME.<12 hex>.partial": 22 bytes more than NAME
LONGEST_OK = NAME_MAX - 22


def run_cli(*args: bytes | str):
    """The command line with argv as bytes (what a shell passes), stdout and stderr as bytes."""
    argv = [a if isinstance(a, bytes) else os.fsencode(a) for a in args]
    cmd = [os.fsencode(sys.executable), b"-m", b"fednest_mpi", *argv]
    env = {**os.environ, "MPI4PY_RC_THREAD_LEVEL": "single", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, timeout=120, env=env)


NAMES = {
    "non-BMP, quotes, spaces": '🚀 it\'s "a" run.h5'.encode(),
    "non-UTF-8 bytes": b"a\xff\xfe b\x80.h5",
    "longest name whose derived names fit": b"c" * (LONGEST_OK - 3) + b".h5",
}


CASES = [(name, "--output") for name in NAMES] + [("non-UTF-8 bytes", "--set"), ("non-BMP, quotes, spaces", "config")]


@pytest.mark.parametrize("key,how", CASES)
def test_any_output_name_lands_exactly_there(tmp_path, key, how):
    name = NAMES[key]
    # a folder named with a non-BMP character and Latin-1 bytes (no UTF-8), but a TOML file is UTF-8 text
    folder = os.fsencode(tmp_path) + b"/" + b"\xf0\x9f\x90\x8d d" + (b"\xe9j\xe0" if how != "config" else b"")
    os.mkdir(folder)
    out = folder + b"/" + name
    cfg = folder + b"/conf \xff 'q'.toml"
    shutil.copy(CONFIG, cfg)
    common = [cfg, b"--set", b"algorithm.outer_iterations=1", b"--quiet"]
    if how == "--output":
        res = run_cli(b"run", *common, b"--output", out)
    elif how == "--set":
        res = run_cli(b"run", *common, b"--set", b"run.output=" + out)
    else:  # a TOML string in a config file (UTF-8 text: no undecodable bytes in the folder for this case)
        text = os.fsdecode(out)
        with open(cfg, "w", encoding="utf-8") as f:  # the shipped config as its base, the output over it
            quoted = text.replace("\\", "\\\\").replace('"', '\\"')
            f.write(f'base = "{CONFIG}"\n[run]\noutput = "{quoted}"\n')
        res = run_cli(b"run", *common)
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"output: " + out + b"\n"  # printed as the very bytes
    assert os.path.isfile(out)
    assert read_run(os.fsdecode(out))[1]["iteration"].tolist() == [0, 1]
    stem = name[:-3]
    left = sorted(os.listdir(folder))
    assert left == sorted([os.path.basename(cfg), name, name + b".ckpt", stem + b".clients"]), left


def test_names_a_file_system_cannot_hold_stop_with_one_line_and_nothing_written(tmp_path):
    out = tmp_path / ("d" * NAME_MAX)  # fits alone; its .lock, .ckpt and temporary names do not
    res = run_cli("run", CONFIG, "--set", "algorithm.outer_iterations=1", "--output", out)
    err = res.stderr.decode()
    assert res.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "over the 255 bytes" in err and "shorten the last name of run.output by at least 22 bytes" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "output,checkpoint_dir,message",
    [
        ("e" * (LONGEST_OK + 1), "", "its temporary file would be named"),
        ("e" * (NAME_MAX - 10), "", "by at least 12 bytes"),  # the worst name's excess, not the first one's
        ("run.h5", "f" * (NAME_MAX - 2), "run.checkpoint_dir: the checkpoint folder's lock file"),
        ("bad\ud83d.h5", "", "a lone surrogate"),  # from a JSON escape; no file name can hold it
        ("bad\ud83d/run.h5", "", "a lone surrogate"),  # in a folder's name: stat() would raise, not say so
        # names the kernel refuses whatever exists (ENAMETOOLONG): stat() raised there, a traceback after the start
        ("g" * (NAME_MAX + 1) + "/run.h5", "", "the folder name 'ggg.*is 256 bytes long, over the 255 bytes"),
        ("/".join(["h" * 200] * 21) + "/run.h5", "", "would be a path of .* bytes, over the 4095"),
        # the output's path fits, the longest file the run makes in its folders would not
        (None, "", "its checkpoint folder would be a path of 405. bytes .and 47 bytes more for the files in it"),
        # two of the run's names the same path: the output would be its own client-file folder
        ("x.clients", "", "'.*x.clients' would be both the output and its client-file folder"),
        ("run.h5", "run.clients", "run.checkpoint_dir: .* would be both its client-file folder and its checkpoint"),
    ],
)
def test_every_derived_name_is_checked(tmp_path, output, checkpoint_dir, message):
    if output is None:  # a path of 4,048 bytes: 4,053 for its checkpoint folder, 4,100 in it
        room = 4048 - len(os.fsencode(tmp_path)) - 1
        output = "/".join(["q" * 200] * (room // 201) + ["r" * max(1, room % 201 - 1)])
        assert len(os.fsencode(tmp_path / output)) in (4047, 4048)
    folder = str(tmp_path / checkpoint_dir) if checkpoint_dir else ""
    with pytest.raises(UsageError, match=message):
        check_names(tmp_path / output, folder)
    check_names(tmp_path / ("e" * LONGEST_OK))


def test_derived_paths_name_every_file_a_run_makes(tmp_path):
    paths = derived_paths(tmp_path / "r.h5")
    assert {p.name for p in paths.values()} >= {"r.h5", "r.h5.lock", "r.h5.failed", "r.clients", "r.h5.ckpt"}
    assert derived_paths(tmp_path / "r.h5", tmp_path / "ck")["the checkpoint folder's lock file"].name == "ck.lock"


def test_an_override_is_a_toml_value_or_the_bare_word_never_a_mangled_mix():
    assert parse_override("run.output=/tmp/a b/🚀.h5") == (["run", "output"], "/tmp/a b/🚀.h5")
    assert parse_override("run.output=/tmp/\udcff.h5")[1] == "/tmp/\udcff.h5"  # undecodable bytes kept
    assert parse_override('run.output="/tmp/x.h5"')[1] == "/tmp/x.h5"
    with pytest.raises(ConfigError, match="starts with a quote but is not one TOML string"):
        parse_override('run.output="/tmp/\\ud83d.h5"')  # json.dumps of a non-BMP name: TOML refuses it
    with pytest.raises(ConfigError, match="close the quotes"):
        parse_override("run.output='/tmp/x.h5")
    with pytest.raises(ConfigError, match=r"run.output: expected a string, got 1000.0; put the text in quotes"):
        config.load(CONFIG, ["run.output=1e3"])  # TOML reads it as a number: the line says how to make it a name
    assert config.load(CONFIG, ['run.output="1e3"']).run.output == "1e3"
    cfg = config.load(CONFIG, ["run.output=ignored.h5"], {"run.output": '/tmp/"\udcff\U0001f680".h5'})
    assert cfg.run.output == '/tmp/"\udcff\U0001f680".h5'  # the value as given, after the --set overrides


def test_a_percent_sign_in_the_output_name_keeps_the_client_series_readable(tmp_path):
    """HDF5 reads '%b' in a virtual dataset's source file name as the run file's own name and '%%' as '%': a run
    named with '%' maps /clients/* to its client files all the same (read here through plain h5py, the VDS)."""
    import h5py
    import numpy as np

    from fednest_mpi.comm import SerialComm
    from fednest_mpi.io.clients import read_clients
    from fednest_mpi.session import Session

    out = tmp_path / "50% of %b %%d.h5"
    cfg = config.load(CONFIG, ["algorithm.outer_iterations=2"], {"run.output": str(out)})
    assert Session(cfg, SerialComm()).run_to_file() == 0
    direct = read_clients(out)  # the per-rank files themselves
    with h5py.File(out, "r") as f:
        through_vds = f["clients/participation"][()]
    assert through_vds.shape == direct["participation"].shape and through_vds.any()
    np.testing.assert_array_equal(through_vds, direct["participation"])


@pytest.mark.parametrize("flag", [[], ["--resume"], ["--skip-finished"]])
def test_a_folder_name_too_long_is_one_line_for_run_resume_and_skip_finished(tmp_path, capsys, flag):
    """stat() of such a path raises (ENAMETOOLONG): checked before anything looks at the files, also before
    --skip-finished reads what the output holds (that used to end in a traceback)."""
    from fednest_mpi.cli import main

    out = tmp_path / ("d" * (NAME_MAX + 45)) / "run.h5"
    assert main(["run", str(CONFIG), "-q", "--output", str(out), *flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run.output: the folder name 'ddd" in err and "300 bytes long" in err, err
    assert list(tmp_path.iterdir()) == []
