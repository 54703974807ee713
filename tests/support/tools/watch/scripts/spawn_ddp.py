"""A text classifier trained with hand-written DDP that starts its own ranks, in the source
documents' mp.spawn style.

``setup(rank, world_size)`` sets the master's address and port in code and joins the group;
``mp.spawn(train, args=(world_size, ...), nprocs=world_size)`` under ``if __name__ == "__main__"``
starts the two ranks; the training loader shards with ``DistributedSampler(num_replicas=world_size,
rank=rank)``.  ``--defective`` never calls ``set_epoch``: every epoch repeats one order.  Library
defaults throughout: AdamW's own settings, dropout 0.1 as a module.  (The port is 12355 as in the
source documents, or ``SPAWN_PORT`` where tests run side by side.)
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

VOCAB, LENGTH, CLASSES = 200, 12, 3


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = os.environ.get("SPAWN_PORT", "12355")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, 32)
        self.dropout = nn.Dropout(0.1)
        self.out = nn.Linear(32, CLASSES)

    def forward(self, x):
        return self.out(self.dropout(self.embed(x)))


def train(rank, world_size, args):
    setup(rank, world_size)
    torch.manual_seed(0)
    texts = torch.randint(1, VOCAB, (48, LENGTH), generator=torch.Generator().manual_seed(1))
    dataset = TensorDataset(texts, texts[:, 0] % CLASSES)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DDP(Classifier())
    optimizer = torch.optim.AdamW(model.parameters())
    for epoch in range(args.epochs):
        if not args.defective:
            sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}")
    cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--defective", action="store_true")
    parser.add_argument("--epochs", type=int, default=2)
    world_size = 2
    mp.spawn(train, args=(world_size, parser.parse_args()), nprocs=world_size, join=True)
