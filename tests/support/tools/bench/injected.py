"""A plain torchrun DDP classifier with causes of a slow step injected on purpose, for the bench's
breakdown tests: a data loader that sleeps on one rank, a forward that sleeps on one rank, a dataset
that sleeps in one sample of N on one rank (a slow disk: now and then, not every batch), a barrier
and a ``.item()`` every step, tiny DDP buckets.  Without flags: a clean script."""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--slow-data-rank", type=int, default=-1)
parser.add_argument("--slow-forward-rank", type=int, default=-1)
parser.add_argument("--slow-sample-rank", type=int, default=-1)
parser.add_argument("--slow-sample-every", type=int, default=32)
parser.add_argument("--sleep-ms", type=float, default=30.0)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--barrier", action="store_true")
parser.add_argument("--item", action="store_true")
parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--layers", type=int, default=8)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            *[nn.Sequential(nn.Linear(128, 128), nn.ReLU()) for _ in range(args.layers)]
        )
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        if rank == args.slow_forward_rank:
            time.sleep(args.sleep_ms / 1e3)
        return self.head(self.layers(x))


def collate(samples):
    if rank == args.slow_data_rank:
        time.sleep(args.sleep_ms / 1e3)
    return torch.utils.data.default_collate(samples)


class SlowSamples(TensorDataset):
    """Sleeps in one sample of ``--slow-sample-every`` on ``--slow-sample-rank``."""

    def __getitem__(self, index):
        if rank == args.slow_sample_rank and index % args.slow_sample_every == 0:
            time.sleep(args.sleep_ms / 1e3)
        return super().__getitem__(index)


x = torch.randn(4096, 128, generator=torch.Generator().manual_seed(1))
data = SlowSamples(x, x[:, :10].argmax(1))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, collate_fn=collate)
model = nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=args.bucket_cap_mb)
optimizer = torch.optim.AdamW(model.parameters())
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for features, labels in loader:
        loss = nn.functional.cross_entropy(model(features), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.barrier:
            dist.barrier()
        if args.item:
            total = loss.item()
dist.destroy_process_group()
