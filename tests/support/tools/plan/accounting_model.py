"""The small model rankwise plan's accounting tests count against: 3 residual MLP blocks (each a
transformer-like unit FSDP wraps) and a head, with AdamW."""

from __future__ import annotations

import torch
from torch import nn

WIDTH, LAYERS, ROWS = 64, 3, 8


class Block(nn.Module):
    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(LAYERS))
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(width: int = WIDTH):
    model = Net(width)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
