"""Data layer: real data sets (MNIST, Fashion-MNIST, UCI Adult), their download, and client partitions.

* :mod:`.files`: data directory resolution (``problem.data_dir`` / ``FEDNEST_DATA``), safe reading, MD5SUMS;
* :mod:`.mnist`: IDX reader and :func:`load_mnist`;
* :mod:`.adult`: :func:`load_adult`;
* :mod:`.download`: :func:`download` with checksums;
* :mod:`.partition`: IID, shard, Dirichlet, inner/outer and long-tail index splits (numpy only);
* :mod:`.federated`: your own arrays as a federated data-set file (:func:`convert_arrays`,
  :func:`convert_npz`, :func:`describe`; the format in :mod:`fednest_mpi.io.federated`).

Every problem with a data file raises :class:`~fednest_mpi.errors.DataError`.
"""

from fednest_mpi.data.adult import AdultData, load_adult
from fednest_mpi.data.download import download
from fednest_mpi.data.federated import convert_arrays, convert_npz
from fednest_mpi.data.files import ENV_VAR, resolve_data_dir
from fednest_mpi.data.mnist import MnistData, load_mnist, read_idx
from fednest_mpi.data.partition import (
    dirichlet_partition,
    iid_partition,
    long_tail_indices,
    shard_partition,
    split_inner_outer,
)

__all__ = [
    "AdultData",
    "ENV_VAR",
    "MnistData",
    "convert_arrays",
    "convert_npz",
    "dirichlet_partition",
    "download",
    "iid_partition",
    "load_adult",
    "load_mnist",
    "long_tail_indices",
    "read_idx",
    "resolve_data_dir",
    "shard_partition",
    "split_inner_outer",
]
