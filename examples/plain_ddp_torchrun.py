"""The blog's plain DDP script (ToyModel, Linear 10->10, ReLU, Linear 10->5), unchanged: no rankwise
import.

``rankwise launch`` starts any torchrun-style script: it exports RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT (a free port on one node), sets one thread per
process on a CPU, and reports which rank failed.  The script only reads the environment::

    rankwise launch --nproc-per-node 2 examples/plain_ddp_torchrun.py --out runs/plain-ddp
    torchrun --nproc-per-node 2 examples/plain_ddp_torchrun.py    # the same, torch's launcher

Each rank writes ``rank-<r>.json`` with the sum of its parameters (DDP keeps the replicas
identical, so every rank writes the same number); rank 0 saves the unwrapped weights.
"""

import argparse
import gc
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="runs/plain-ddp")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    # reads RANK, WORLD_SIZE, MASTER_ADDR/PORT
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = optimizer = None
    try:
        torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
        model = DistributedDataParallel(
            ToyModel().to(device), device_ids=[local_rank] if use_cuda else None
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
        # each rank its own random batch, as in the blog
        generator = torch.Generator().manual_seed(100 + rank)
        for _ in range(args.steps):
            optimizer.zero_grad()
            outputs = model(torch.randn(20, 10, generator=generator).to(device))
            loss = nn.functional.mse_loss(
                outputs, torch.randn(20, 5, generator=generator).to(device)
            )
            # DDP all-reduces (averages) the gradients here, so every replica steps alike
            loss.backward()
            optimizer.step()

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        checksum = sum(p.detach().double().sum().item() for p in model.parameters())
        (out / f"rank-{rank}.json").write_text(
            json.dumps({"rank": rank, "world_size": world_size, "parameter_sum": checksum})
        )
        if rank == 0:
            # .module: no "module." prefix in the keys
            torch.save(model.module.state_dict(), out / "toy.pt")
            print(
                f"rank 0 saved {out / 'toy.pt'} after {args.steps} steps on {world_size} processes"
            )
    finally:
        # torch 2.13 on gloo can abort at exit when a DDP module outlives its process group:
        # drop the module, collect it, and let every rank reach this point before tearing down.
        model = optimizer = None
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
