"""Federated data-set files (io/federated.py, data/federated.py): round trip against the partition
functions, reproducibility, block reads, one clear message per defect, the `data` command line."""

import os
import shutil

import h5py
import numpy as np
import pytest

from fednest_mpi.cli import main
from fednest_mpi.data import convert_arrays, convert_npz, dirichlet_partition, iid_partition, shard_partition
from fednest_mpi.errors import DataError
from fednest_mpi.io.federated import FederatedFile

N, M = 503, 9


@pytest.fixture
def arrays():
    gen = np.random.default_rng(7)
    return gen.normal(size=(N, 2, 3)).astype(np.float32), gen.integers(0, 4, N), gen.normal(size=(40, 2, 3))


@pytest.mark.parametrize(
    "partition,expected",
    [
        ("iid", lambda y: iid_partition(N, M, 3)),
        ("shards", lambda y: shard_partition(y, M, 3, 2 * M, 2, equal_shards=False)),
        ("dirichlet", lambda y: dirichlet_partition(y, M, 0.3, 3, min_size=5)),
    ],
)
def test_clients_hold_exactly_their_partition_rows(tmp_path, arrays, partition, expected):
    x, y, xt = arrays
    path = convert_arrays(
        x, y, tmp_path / "f.h5", partition, M, seed=3, alpha=0.3, min_size=5, test=(xt, np.arange(40) % 4)
    )
    data = FederatedFile(path)
    parts = expected(y)
    assert data.n_clients == M and data.n_classes == 4 and data.feature_shape == (2, 3)
    assert data.n_samples == sum(map(len, parts)) and list(data.client_sizes()) == [len(p) for p in parts]
    for block in (range(0, M), range(2, 5), range(8, 9), range(4, 4)):
        got = data.read_clients(block)
        assert len(got.offsets) == len(block) + 1 and got.offsets[0] == 0
        for b, i in enumerate(block):
            rows = slice(got.offsets[b], got.offsets[b + 1])
            np.testing.assert_array_equal(got.features[rows], x[parts[i]])
            np.testing.assert_array_equal(got.labels[rows], y[parts[i]])
    test_x, test_y = data.read_test()
    np.testing.assert_array_equal(test_x, xt)
    np.testing.assert_array_equal(test_y, np.arange(40) % 4)
    if partition != "iid":  # these keep every sample
        assert data.n_samples == N


def test_same_seed_same_file_other_seed_other_split(tmp_path, arrays):
    x, y, _ = arrays
    blocks = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        data = FederatedFile(convert_arrays(x, y, tmp_path / f"{name}.h5", "dirichlet", M, seed=seed))
        blocks.append(data.read_clients(range(M)))
    np.testing.assert_array_equal(blocks[0].features, blocks[1].features)
    np.testing.assert_array_equal(blocks[0].offsets, blocks[1].offsets)
    assert not np.array_equal(blocks[0].offsets, blocks[2].offsets)


def _valid(tmp_path, arrays) -> str:
    x, y, _ = arrays
    return str(convert_arrays(x, y, tmp_path / "ok.h5", "iid", M, seed=0, test=(x[:10], y[:10])))


def _edit(path, change):
    with h5py.File(path, "a") as f:
        change(f)


def _replace(name, value):
    def change(f):
        del f[name]
        f[name] = value

    return change


DEFECTS = {
    "missing labels": (lambda f: f.__delitem__("labels"), "the dataset /labels is missing"),
    "offsets not monotone": (_replace("client_offsets", np.array([0, 60, 50] + [55] * 7)), "not strictly increasing"),
    "offsets end early": (_replace("client_offsets", np.arange(M + 1) * 10), "ends at 90, but /features has 495"),
    "offsets start late": (_replace("client_offsets", np.arange(1, M + 2) * 5), "starts at 5, not 0"),
    "float labels": (_replace("labels", np.zeros(495)), "/labels must be a 1-D integer array"),
    "string features": (_replace("features", np.full((495, 2, 3), b"a")), "dtype |S1; it must be float or integer"),
    "label out of range": (_replace("labels", np.arange(495) % 5), "/labels[4] is 4, outside 0..3"),
    "test label out of range": (_replace("test/labels", np.full(10, -1)), "/test/labels[0] is -1"),
    "feature shape": (_replace("features", np.zeros((495, 6))), "feature_shape says (N, 2, 3)"),
    "wrong format": (lambda f: f.attrs.__setitem__("format", "other"), "not a federated data file"),
    "newer version": (lambda f: f.attrs.__setitem__("format_version", 99), "format_version 99"),
    "no n_classes": (lambda f: f.attrs.__delitem__("n_classes"), "the attribute n_classes is missing"),
}


@pytest.mark.parametrize("defect", DEFECTS)
def test_each_defect_is_one_message_naming_it(tmp_path, arrays, defect, capsys):
    path = _valid(tmp_path, arrays)
    change, message = DEFECTS[defect]
    _edit(path, change)
    with pytest.raises(DataError, match=None) as err:
        FederatedFile(path)
    assert message in str(err.value) and path in str(err.value) and "\n" not in str(err.value)
    assert main(["data", "check", path]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_truncated_and_foreign_files_are_refused(tmp_path, arrays):
    path = _valid(tmp_path, arrays)
    cut = tmp_path / "cut.h5"
    with open(path, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(os.path.getsize(path) // 2))
    with pytest.raises(DataError, match="truncated: .* copy the file again or rewrite it with"):
        FederatedFile(cut)
    np.savez(tmp_path / "a.npz", features=np.zeros(3), labels=np.zeros(3, int))
    with pytest.raises(DataError, match="no HDF5 signature"):
        FederatedFile(tmp_path / "a.npz")


def test_nan_is_refused_in_the_block_that_holds_it(tmp_path, arrays):
    x, y, _ = arrays
    x = x.copy()
    path = tmp_path / "nan.h5"
    shutil.copy(convert_arrays(x, y, tmp_path / "ok.h5", "iid", M, seed=0), path)
    data = FederatedFile(path)
    bad_row = int(data.offsets[6]) + 1

    def poison(f):
        f["features"][bad_row, 1, 2] = np.nan

    _edit(path, poison)
    data = FederatedFile(path)  # structure fine: the defect shows where its rows are read
    data.read_clients(range(0, 6))
    data.read_clients(range(7, M))
    with pytest.raises(DataError, match=rf"/features\[{bad_row}\], client 6 holds NaN"):
        data.read_clients(range(5, 8))
    with pytest.raises(DataError, match="client 6"):
        data.check_features()


def test_converter_refuses_bad_arrays_with_the_fix(tmp_path):
    with pytest.raises(DataError, match="labels must be a 1-D integer array"):
        convert_arrays(np.zeros((4, 2)), np.zeros(4), tmp_path / "o.h5")
    with pytest.raises(DataError, match="features must be a float or integer array of 4 rows"):
        convert_arrays(np.zeros((3, 2)), np.zeros(4, int), tmp_path / "o.h5")
    with pytest.raises(DataError, match="--n-classes 2: the labels go up to 4"):
        convert_arrays(np.zeros((5, 2)), np.arange(5), tmp_path / "o.h5", n_clients=2, n_classes=2)
    with pytest.raises(DataError, match="features row 0 holds NaN or infinite values"):
        convert_arrays(np.full((4, 2), np.inf), np.zeros(4, int), tmp_path / "o.h5", n_clients=2)
    with pytest.raises(DataError, match="--partition dirichlet with --clients 9: alpha must be positive"):
        convert_arrays(np.zeros((40, 2)), np.arange(40) % 3, tmp_path / "o.h5", "dirichlet", 9, alpha=-1.0)
    with pytest.raises(DataError, match="--partition shards: a client would have no sample; use fewer --clients"):
        convert_arrays(np.zeros((40, 2)), np.arange(40) % 3, tmp_path / "o.h5", "shards", 30)
    assert not list(tmp_path.iterdir())
    np.savez(tmp_path / "k.npz", pixels=np.zeros(3))
    with pytest.raises(DataError, match="holds the arrays pixels; it needs 'features' and 'labels'"):
        convert_npz(tmp_path / "k.npz", tmp_path / "o.h5")


def test_command_line_convert_then_check(tmp_path, arrays, capsys):
    x, y, _ = arrays
    np.savez(tmp_path / "in.npz", x_train=x, y_train=y, x_test=x[:5], y_test=y[:5])
    out = str(tmp_path / "out.h5")
    args = ["data", "convert", str(tmp_path / "in.npz"), "-p", "shards", "-M", "5", "--seed", "4", "-o", out]
    assert main(args) == 0
    assert "5 clients, 503 samples of shape (2, 3), 4 classes, 5 test samples" in capsys.readouterr().out
    assert main(args) == 2 and "already exists" in capsys.readouterr().err
    assert main(["data", "check", out]) == 0
    expected = shard_partition(y, 5, 4, 10, 2, equal_shards=False)
    got = FederatedFile(out).read_clients(range(5))
    np.testing.assert_array_equal(got.labels, y[np.concatenate(expected)])


def test_help_has_a_runnable_example(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["data", "convert", "--help"])
    assert exit_.value.code == 0
    assert "fednest-mpi data convert mine.npz --partition dirichlet" in capsys.readouterr().out


def test_command_line_convert_output_paths(tmp_path, arrays, capsys):
    """The output of `data convert` as a run's: its folders are made; a folder name too long for the kernel, a file
    where a folder goes, a FIFO at the path: one line naming it (the first was a traceback)."""
    x, y, _ = arrays
    np.savez(tmp_path / "in.npz", x_train=x, y_train=y)
    (tmp_path / "plain").write_text("x")
    os.mkfifo(tmp_path / "pipe.h5")

    def convert(out):
        return main(["data", "convert", str(tmp_path / "in.npz"), "-p", "iid", "-M", "5", "-o", str(out)])

    assert convert(tmp_path / "new" / "sub" / "out.h5") == 0 and (tmp_path / "new" / "sub" / "out.h5").is_file()
    capsys.readouterr()
    for out, message in (
        (tmp_path / ("d" * 300) / "out.h5", "cannot be read (File name too long); choose another path"),
        (tmp_path / "plain" / "out.h5", "--output: '" + str(tmp_path / "plain") + "' is a file, not a folder"),
        (tmp_path / "pipe.h5", "is a FIFO (named pipe)"),
    ):
        assert convert(out) == 2, out
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
