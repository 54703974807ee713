"""A small training script on rankwise.setup() with one way (or none) to break equivalence, for
`rankwise verify`.

python tests/support/tools/verify_cases.py --case ok  # every rank count computes the same --case
batch-norm          BatchNorm1d normalises over each rank's share of the batch --case micro-mean
a loss averaged over each micro-batch's tokens, whose count varies --case plain-loader        a
torch DataLoader without a rank sampler: each rank sees every sample --case rank-seeded-sampler a
DistributedSampler shuffled with the rank as its seed: the ranks' shares overlap --case
functional-dropout  F.dropout in forward: rankwise cannot switch it off --case half
bfloat16 parameters: gradients accumulate in 16 bits --case unused              a layer that never
gets a gradient --case plain-calls         loss.backward() and optimizer.step() instead of
rt.backward / rt.step (equivalent)
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import rankwise

FEATURES, CLASSES, LENGTH = 8, 3, 6


class Tokens(Dataset):
    """Samples of LENGTH positions, each with a class label; a random number of trailing positions
    is padding."""

    def __init__(self, samples: int):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(samples, LENGTH, FEATURES, generator=g)
        self.labels = torch.randint(0, CLASSES, (samples, LENGTH), generator=g)
        valid = torch.randint(1, LENGTH + 1, (samples,), generator=g)
        self.labels[torch.arange(LENGTH) >= valid[:, None]] = -100

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.labels[i]}


class Net(nn.Module):
    def __init__(self, case: str):
        super().__init__()
        self.case = case
        self.inp = nn.Linear(FEATURES, 16)
        self.norm = nn.BatchNorm1d(16) if case == "batch-norm" else nn.Identity()
        self.drop = nn.Dropout(0.3)  # switched off by rankwise verify unless --keep-dropout
        self.out = nn.Linear(16, CLASSES)
        self.spare = nn.Linear(16, 16) if case == "unused" else None

    def forward(self, x):
        h = torch.relu(self.norm(self.inp(x).transpose(1, 2)).transpose(1, 2))
        if self.case == "functional-dropout":
            h = F.dropout(h, 0.2, self.training)
        return self.out(self.drop(h))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", default="ok")
    parser.add_argument("--batch-size", type=int, default=16, help="global batch")
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    dataset = Tokens(128)
    with rankwise.setup(seed=0) as rt:
        model = Net(args.case)
        if args.case == "half":
            model = model.to(torch.bfloat16)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        model, optimizer = rt.prepare(model, optimizer, grad_accum=args.grad_accum)
        micro_batch = args.batch_size // args.grad_accum
        if args.case == "plain-loader":
            loader = DataLoader(dataset, batch_size=micro_batch, shuffle=False)
        elif args.case == "rank-seeded-sampler":
            sampler = DistributedSampler(
                dataset, rt.world_size, rt.rank, shuffle=True, seed=rt.rank
            )
            loader = DataLoader(
                dataset, batch_size=micro_batch // rt.world_size, sampler=sampler, drop_last=True
            )
        else:
            loader = rt.loader(dataset, batch_size=micro_batch, shuffle=True)
        step = 0
        for _, last, batch in rankwise.iterate_steps(loader, args.grad_accum):
            batch = rt.to_device(batch)
            x = batch["x"].to(torch.bfloat16) if args.case == "half" else batch["x"]
            with rt.no_sync(model, enabled=not last):
                logits = model(x).float()
                losses = F.cross_entropy(
                    logits.reshape(-1, CLASSES),
                    batch["labels"].reshape(-1),
                    reduction="none",
                    ignore_index=-100,
                )
                if args.case == "micro-mean":
                    # mean over this micro-batch's tokens
                    loss = losses.sum() / (batch["labels"] != -100).sum()
                else:
                    # per-sample mean: exact
                    loss = (losses.reshape(len(x), LENGTH).sum(1) / LENGTH).mean()
                if args.case == "plain-calls":
                    (loss / args.grad_accum).backward()
                else:
                    rt.backward(loss / args.grad_accum, model)
            if last:
                if args.case == "plain-calls":
                    optimizer.step()
                    optimizer.zero_grad()
                else:
                    rt.step(optimizer, model)
                    rt.zero_grad(optimizer)
                step += 1
                if step == args.steps:
                    break


if __name__ == "__main__":
    main()
