"""A LeNet-style CNN as the body of hyper-representation learning (FedNest paper section 4.1): a model plugin.

The paper's problem with x = every weight of this network (the representation) and y = a linear head on
its 84 features; fednest-mpi derives the five oracles from the two losses with torch.func
(``problem.model = "fednest_cnn_hyperrep:LeNet"``, docs/extending.md). The body receives a client's
image rows as (n, 784) and returns (n, 84) features; it holds no buffers and draws no random numbers.
"""

from torch import nn


class LeNet(nn.Module):
    """28 x 28 -> conv 5x5 (6) -> relu -> pool 2 -> conv 5x5 (16) -> relu -> pool 2 -> 256 -> 120 -> 84."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.dense = nn.Sequential(nn.Linear(16 * 4 * 4, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU())

    def forward(self, rows):
        images = rows.reshape(-1, 1, 28, 28)
        return self.dense(self.features(images).flatten(1))
