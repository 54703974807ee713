"""The ``toy`` task: random features with labels from a fixed random linear teacher.

4,096 samples for one dense layer by default, like the classic random-data DDP example, but
learnable, so accuracy means something.  Fully determined by the seed.
"""

from __future__ import annotations

import torch


def make_toy(
    samples: int, features: int, classes: int, seed: int = 1234
) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=generator)
    teacher = torch.randn(features, classes, generator=generator)
    noise = 0.5 * torch.randn(samples, classes, generator=generator)
    y = (x @ teacher + noise).argmax(dim=1)
    return x, y
