"""The trace's own pieces, in one process: where random operations run, whatever else the forward
does."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rankwise.tools.step_trace import RandomOps


class Block(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5, self.training)  # functional: no module verify could switch off


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), Block())
        self.off = nn.Dropout(0.0)  # p = 0 draws nothing

    def forward(self, x):
        x = self.off(self.inner(x))
        # A higher-order operator (as flex_attention is) runs under the watcher unharmed.
        x = torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))
        return x + 0.01 * torch.randn_like(x)  # the script's own noise, in the model's forward


def test_random_operations_are_located_in_the_module_that_ran_them():
    model, batch = Net(), torch.randn(3, 4)
    with RandomOps(model) as watcher:
        model(batch).sum().backward()
        # the script's own, after the batch came: outside the model
        augmented = batch + torch.rand(3, 4)
    assert watcher.found == {
        "dropout in inner.1": 1,
        "randn_like in Net": 1,
        "rand in the script, outside the model": 1,
    }, watcher.found
    assert augmented.shape == batch.shape
    assert not torch.nn.modules.module._global_forward_pre_hooks  # the watcher's hooks are gone
