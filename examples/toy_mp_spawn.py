"""The blog's ToyModel (Linear 10->10, ReLU, Linear 10->5) trained with DDP via mp.spawn, on
rankwise.

The source sets MASTER_ADDR/MASTER_PORT by hand, calls init_process_group in a
``setup(rank, world_size)`` and forgets to save the model.  Here ``rankwise.spawn``
exports the rank variables and picks a free port, ``rankwise.setup`` joins the group, and
rank 0 saves unwrapped weights (no ``module.`` prefix)::

    python examples/toy_mp_spawn.py --nprocs 2 --out runs/toy-spawn
"""

import argparse
import json
from pathlib import Path

import torch
from plain_ddp_torchrun import ToyModel  # the blog's model, shared with the plain torchrun example
from torch import nn

import rankwise


def train(local_rank: int, steps: int, out: str) -> None:
    with rankwise.setup("ddp", seed=0) as rt:
        model = ToyModel()
        model, optimizer = rt.prepare(model, torch.optim.SGD(model.parameters(), lr=0.001))
        # each rank its own random batch, as in the blog
        generator = torch.Generator().manual_seed(100 + rt.rank)
        for _ in range(steps):
            outputs = model(torch.randn(20, 10, generator=generator).to(rt.device))
            loss = nn.functional.mse_loss(
                outputs, torch.randn(20, 5, generator=generator).to(rt.device)
            )
            rt.backward(loss, model)
            rt.step(optimizer, model)
            rt.zero_grad(optimizer)
        rt.save_weights(model, Path(out) / "toy.safetensors")
        if rt.is_main:
            Path(out, "summary.json").write_text(
                json.dumps({"world_size": rt.world_size, "steps": steps})
            )
            print(
                f"rank 0 saved {Path(out) / 'toy.safetensors'} after {steps} steps on "
                f"{rt.world_size} processes"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="runs/toy-spawn")
    args = parser.parse_args()
    # like mp.spawn(fn, args, nprocs)
    rankwise.spawn(train, args.nprocs, args=(args.steps, args.out))


if __name__ == "__main__":
    main()
