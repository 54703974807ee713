"""The classic random-data DDP script (4,096 samples, one dense layer), on rankwise.

A plain single-device loop; the lines marked `# rankwise` are all that changed to make
it distributed.  Run it with any number of processes:

    rankwise launch --nproc-per-node 2 examples/random_data_ddp.py --epochs 2
    python examples/random_data_ddp.py            # one process, same code

Each rank reports the loss it sees; rank 0 prints the mean over ranks and saves the
unwrapped weights.
"""

import argparse
import json
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import rankwise


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--features", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument(
        "--out", default="runs/random-data", help="where rank 0 saves weights and a summary"
    )
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, args.features, generator=generator)
    y = x @ torch.randn(args.features, 1, generator=generator) + 0.1 * torch.randn(
        args.samples, 1, generator=generator
    )
    dataset = TensorDataset(x, y)

    with rankwise.setup(strategy=args.strategy, seed=0) as rt:  # rankwise
        model = nn.Linear(args.features, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        model, optimizer = rt.prepare(model, optimizer)  # rankwise
        loader = rt.loader(dataset, batch_size=args.batch_size, shuffle=True)  # rankwise
        for epoch in range(args.epochs):
            rt.set_epoch(loader, epoch)  # rankwise
            for inputs, targets in loader:
                inputs, targets = rt.to_device((inputs, targets))  # rankwise
                loss = nn.functional.mse_loss(model(inputs), targets)
                rt.backward(loss, model)  # rankwise
                rt.step(optimizer, model)  # rankwise
                rt.zero_grad(optimizer)
            # Why: one all-reduce per epoch, only to report the loss averaged over ranks.
            mean_loss = rt.all_reduce(loss.detach(), "mean").item()
            rt.print(
                f"epoch {epoch}: loss {mean_loss:.4f} ({rt.world_size} processes, {len(loader)} "
                "steps each)"
            )
        out = Path(args.out)
        rt.save_weights(model, out / "model.safetensors")  # rankwise
        if rt.is_main:
            summary = {
                "world_size": rt.world_size,
                "steps_per_epoch": len(loader),
                "loss": mean_loss,
            }
            (out / "summary.json").write_text(json.dumps(summary), encoding="utf-8")


if __name__ == "__main__":
    main()
