"""A small causal LM sharded with FSDP2 (``fully_shard``), two micro-batches per step, as a user
writes it.

The loss is a mean over the step's real tokens on every rank together (the count all-reduced first);
``--per-micro-batch-mean`` averages each micro-batch over its own tokens instead, the common
mistake.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset, DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--per-micro-batch-mean", action="store_true")
parser.add_argument("--accumulation", type=int, default=2)
args = parser.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
VOCAB, WIDTH = 64, 32


class Sequences(Dataset):
    def __init__(self, count):
        generator = torch.Generator().manual_seed(3)
        self.rows = [
            torch.randint(
                1,
                VOCAB,
                (int(torch.randint(4, 17, (1,), generator=generator)),),
                generator=generator,
            )
            for _ in range(count)
        ]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    length = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    labels = torch.full((len(rows), length), -100)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        labels[i, : len(row) - 1] = row[1:]
    return ids, labels


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.block = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * WIDTH, WIDTH)
        )
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        x = self.embed(ids)
        return self.head(self.norm(x + self.block(x)))


model = TinyLM()
fully_shard(model.block)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
dataset = Sequences(128)
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=collate)

micro = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    for ids, labels in loader:
        micro.append((ids, labels))
        if len(micro) < args.accumulation:
            continue
        tokens = torch.tensor(sum(int((labels != -100).sum()) for _, labels in micro))
        dist.all_reduce(tokens)  # the step's real tokens on every rank
        for ids, labels in micro:
            logits = model(ids)
            if args.per_micro_batch_mean:
                loss = (
                    nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
                    / args.accumulation
                )
            else:
                summed = nn.functional.cross_entropy(
                    logits.flatten(0, 1), labels.flatten(), reduction="sum"
                )
                loss = summed * dist.get_world_size() / tokens  # FSDP averages the ranks' gradients
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        micro = []
dist.destroy_process_group()
