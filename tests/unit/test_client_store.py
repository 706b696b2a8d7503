"""Per-client state across rounds (FedBiO's y^(m), FedBiOAcc's momenta) is stored compactly: rows only
for the clients that took part, every other client reading the initial row."""

import numpy as np
import torch

from fednest_mpi.algorithms.base import ClientStore


def test_rows_exist_only_for_written_clients_and_read_back_by_id():
    store = ClientStore(range(100, 1100), {"y": torch.arange(3.0)})
    assert store.tables["y"].shape[0] == 0
    store.put(np.array([105, 900, 101]), y=torch.tensor([[1.0, 1, 1], [2, 2, 2], [3, 3, 3]]))
    store.put(np.array([900, 500]), y=torch.tensor([[4.0, 4, 4], [5, 5, 5]]))
    assert store.count == 4 and store.tables["y"].shape[0] <= 8  # grown by doubling, not to 1,000 rows
    got = store.get("y", np.array([101, 102, 500, 900, 105]))
    torch.testing.assert_close(got, torch.tensor([[3.0, 3, 3], [0, 1, 2], [5, 5, 5], [4, 4, 4], [1, 1, 1]]))
    assert store.seen(np.array([101, 102])).tolist() == [True, False]
    dense = store.block_rows("y")
    assert dense.shape == (1000, 3)
    torch.testing.assert_close(store.block_sum("y"), dense.sum(0))
    ids, rows = store.export()["y"]
    assert ids.tolist() == [101, 105, 500, 900]
    other = ClientStore(range(100, 1100), {"y": torch.arange(3.0)})
    other.load(store.export())
    assert torch.equal(other.block_rows("y"), dense) and torch.equal(other.block_sum("y"), store.block_sum("y"))
