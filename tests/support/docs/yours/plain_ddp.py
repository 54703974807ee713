"""Stand-in for "your plain torchrun script" (``my_script.py``, ``my_ddp_script.py``,
``train_ddp.py`` in the docs): DDP written by hand, no rankwise import, with the flags the docs pass
it.

A correct script: a DistributedSampler with ``set_epoch``, the global batch split over the ranks,
weights saved unwrapped on rank 0, the process group closed.  The documentation tier
(tests/support/docs/codeblocks.py) puts it at the root of its copy of the repository under those
names.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--my-arg", type=int, default=0, help="the docs' example of your own flag")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--samples", type=int, default=512)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from the launcher
    world_size = dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 16, generator=generator)
    dataset = TensorDataset(x, x.sum(1, keepdim=True))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=64 // world_size, sampler=sampler)
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's too)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new order each epoch, the same on every rank
        for inputs, targets in loader:
            loss = nn.functional.mse_loss(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()  # DDP averages the gradients over the ranks here
            optimizer.step()
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "model.pt")
    # every rank saved (or skipped saving) before the group closes
    dist.barrier()
    dist.destroy_process_group()
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print(f"trained {args.epochs} epoch(s) on {world_size} process(es)")


if __name__ == "__main__":
    main()
