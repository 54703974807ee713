"""Toy models for the ``toy`` task: one dense layer, and a Linear-ReLU-Linear MLP (PyTorch's DDP
tutorial's ToyModel).

``split_devices`` puts the two halves of the MLP on two devices inside one process
(the tutorial's ToyMpModel), the pattern DDP supports without ``device_ids``.
"""

from __future__ import annotations

import torch
from torch import nn

TOY_MODELS = ("linear", "mlp")


class LinearClassifier(nn.Module):
    def __init__(self, features: int, num_labels: int):
        super().__init__()
        self.dense = nn.Linear(features, num_labels)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.dense(features)


class ToyMLP(nn.Module):
    def __init__(
        self,
        features: int,
        num_labels: int,
        hidden: int = 10,
        dropout: float = 0.0,
        devices: tuple[str, str] | None = None,
    ):
        super().__init__()
        self.devices = devices
        self.net1 = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout))
        self.net2 = nn.Linear(hidden, num_labels)
        if devices:
            self.net1.to(devices[0])
            self.net2.to(devices[1])

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.devices:
            hidden = self.net1(features.to(self.devices[0]))
            return self.net2(hidden.to(self.devices[1]))
        return self.net2(self.net1(features))


def split_device_pair(local_rank: int) -> tuple[str, str]:
    """The two devices of one rank: cuda:2r and cuda:2r+1 when present, else the CPU twice."""
    first = 2 * local_rank
    if torch.cuda.device_count() >= first + 2:
        return f"cuda:{first}", f"cuda:{first + 1}"
    return "cpu", "cpu"


def build_toy(
    name: str,
    features: int,
    num_labels: int,
    dropout: float,
    split_devices: bool = False,
    local_rank: int = 0,
):
    spec = {
        "kind": "toy",
        "name": name,
        "features": features,
        "num_labels": num_labels,
        "dropout": dropout,
    }
    return toy_from_spec(spec, split_device_pair(local_rank) if split_devices else None), spec


def toy_from_spec(spec: dict, devices: tuple[str, str] | None = None) -> nn.Module:
    if spec["name"] == "linear":
        return LinearClassifier(spec["features"], spec["num_labels"])
    return ToyMLP(spec["features"], spec["num_labels"], dropout=spec["dropout"], devices=devices)
