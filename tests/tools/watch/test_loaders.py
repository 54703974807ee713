"""How the watcher numbers a script's DataLoaders."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from rankwise.tools.watch.loaders import LoaderWatch

pytestmark = pytest.mark.unit


def test_a_loader_built_anew_over_the_same_sampler_each_epoch_is_one_loader():
    """DeepSpeed's DeepSpeedDataLoader builds a new DataLoader over its DistributedSampler at every
    __iter__: its epochs are one loader's passes (so a sampler never given set_epoch is found)."""
    data = TensorDataset(torch.arange(8.0))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True)
    watch = LoaderWatch()
    epochs = [DataLoader(data, batch_size=2, sampler=sampler) for _ in range(2)]
    assert [watch.number(loader) for loader in epochs] == [0, 0]
    # (the samplers a DataLoader makes itself are new each time: other loaders)
    evaluation = [DataLoader(data, batch_size=2), DataLoader(data, batch_size=2)]
    assert [watch.number(loader) for loader in evaluation] == [1, 2]
    assert watch.number(epochs[0]) == 0
