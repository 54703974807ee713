"""Stand-in for "your script on rankwise.setup()" (``train.py``, ``my_train.py`` in the docs): the
README's ported loop on a small regression task, with the flags the docs pass it.

The documentation tier (tests/support/docs/codeblocks.py) puts it at the root of its copy of the
repository under those names, so that ``rankwise launch --nproc-per-node 2 train.py --my-arg 1``
runs there exactly as the README shows it.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset

import rankwise


class Block(nn.Module):
    """One residual layer: what FSDP shards as a unit and activation checkpointing recomputes."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Model(nn.Module):
    _no_split_modules = ["Block"]  # the layer class, for FSDP and activation checkpointing

    def __init__(self, features: int = 16, width: int = 32, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--my-arg", type=int, default=0, help="the docs' example of your own flag")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--samples", type=int, default=512)
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 16, generator=generator)
    train_set = TensorDataset(x, x.sum(1, keepdim=True))
    with rankwise.setup(seed=0) as rt:
        model = Model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        model, optimizer = rt.prepare(model, optimizer)
        loader = rt.loader(train_set, batch_size=64, shuffle=True)
        for epoch in range(args.epochs):
            rt.set_epoch(loader, epoch)
            for inputs, targets in loader:
                inputs, targets = rt.to_device((inputs, targets))
                with rt.autocast():
                    loss = nn.functional.mse_loss(model(inputs).float(), targets)
                rt.backward(loss, model)
                rt.step(optimizer, model, max_norm=1.0)
                rt.zero_grad(optimizer)
        rt.save_weights(model, "model.safetensors")


if __name__ == "__main__":
    main()
