"""problem.data_file: hyper_representation and loss_tuning on a federated data-set file. MNIST
converted with the partition a built-in run uses gives that run bitwise; a file that does not fit
is refused with one message naming the field and the fix."""

import dataclasses

import numpy as np
import pytest
import torch
from shared_data import DATA, requires, small_mnist_config

from fednest_mpi.comm import SerialComm
from fednest_mpi.data import convert_arrays, load_mnist, long_tail_indices
from fednest_mpi.errors import ConfigError, DataError
from fednest_mpi.problems import build_problem
from fednest_mpi.runner import simulate

pytestmark = requires("mnist")
M = 20


@pytest.fixture(scope="module")
def mnist():
    return load_mnist(DATA / "mnist")


def _run(name, **problem):
    cfg = small_mnist_config(name, **problem)
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, outer_iterations=2))
    return simulate(cfg, SerialComm())


def _same(a, b):
    assert a.history.keys() == b.history.keys()
    for key in a.history:
        if "time" not in key:
            np.testing.assert_array_equal(a.history[key], b.history[key], err_msg=key)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


@pytest.mark.slow
def test_hyper_representation_on_converted_mnist_is_the_built_in_run(tmp_path, mnist):
    test = (mnist.test_x.numpy(), mnist.test_y.numpy())
    path = convert_arrays(mnist.train_x.numpy(), mnist.train_y.numpy(), tmp_path / "m.h5", "iid", M, seed=0, test=test)
    built_in = _run("hyper_representation", hidden=6, partition="iid")
    from_file = _run("hyper_representation", hidden=6, partition="shards", data_file=str(path))
    _same(built_in, from_file)


def test_loss_tuning_on_converted_long_tail_mnist_is_the_built_in_run(tmp_path, mnist):
    labels = mnist.train_y.numpy()
    keep = long_tail_indices(labels, 10, 6000, 100.0)
    test = (mnist.test_x.numpy(), mnist.test_y.numpy())
    path = convert_arrays(mnist.train_x.numpy()[keep], labels[keep], tmp_path / "lt.h5", "shards", M, seed=0, test=test)
    built_in = _run("loss_tuning", hidden1=7, hidden2=5)
    from_file = _run("loss_tuning", hidden1=7, hidden2=5, data_file=str(path))
    _same(built_in, from_file)


def _problem(path, **fields):
    cfg = small_mnist_config("hyper_representation", hidden=4, data_file=str(path), **fields)
    return build_problem(cfg.problem, 0, range(0, 3), dtype=torch.float64)


def test_a_file_that_does_not_fit_is_one_message(tmp_path):
    gen = np.random.default_rng(0)
    x, y = gen.normal(size=(400, 784)), gen.integers(0, 10, 400)
    path = convert_arrays(x, y, tmp_path / "a.h5", "iid", 10, seed=0, test=(x[:60], y[:60]))
    with pytest.raises(ConfigError, match="problem.n_clients: 20, but problem.data_file .* holds 10 clients; set"):
        _problem(path)
    with pytest.raises(DataError, match=r"holds samples of shape \(7,\) in 10 classes; .* needs 784 numbers"):
        _problem(convert_arrays(x[:, :7], y, tmp_path / "b.h5", "iid", 20, seed=0, test=(x[:60, :7], y[:60])))
    with pytest.raises(DataError, match="has no test set, which the metrics need"):
        _problem(convert_arrays(x, y, tmp_path / "c.h5", "iid", 20, seed=0))
    with pytest.raises(ConfigError, match="problem.batch_size: 17 is more than the 16 inner"):
        _problem(convert_arrays(x, y, tmp_path / "d.h5", "iid", 20, seed=0, test=(x[:60], y[:60])), batch_size=17)
    with pytest.raises(DataError, match=r"its test set has no sample of class\(es\) 3, 5; the metrics need every"):
        keep = (y[:50] != 3) & (y[:50] != 5)
        _problem(convert_arrays(x, y, tmp_path / "e.h5", "iid", 20, seed=0, test=(x[:50][keep], y[:50][keep])))
    problem = _problem(path, n_clients=10, batch_size=8)  # 40 samples per client: 32 inner, 8 outer
    assert problem.inputs.shape == (3 * 40, 784) and problem.test_inputs.shape == (60, 784)
