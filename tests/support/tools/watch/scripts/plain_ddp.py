"""A text classifier trained with hand-written DDP, in the source documents' style (torchrun starts
it).

``--defective`` makes the mistakes such scripts make: no ``set_epoch``, every rank evaluating the
whole test set and gathering the predictions, a barrier and a loss all-reduce every step, every rank
saving ``model.state_dict()`` (DDP's ``module.`` keys) to one path.  ``--per-rank-metrics``: rank
0 prints its own loss every step, and a torchmetrics mean built with ``sync_on_compute=False``
reports each rank's.  Library defaults throughout:
AdamW's own settings, dropout 0.1 as a module.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--defective", action="store_true")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=8, help="per rank")
parser.add_argument(
    "--batch-sampler", action="store_true", help="batch with a BatchSampler of the script's own"
)
parser.add_argument("--per-rank-metrics", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)

vocab, length, classes = 200, 12, 3
texts = torch.randint(1, vocab, (64, length), generator=torch.Generator().manual_seed(1))
labels = texts[:, 0] % classes
test_texts = torch.randint(1, vocab, (40, length), generator=torch.Generator().manual_seed(2))
train_set, test_set = (
    TensorDataset(texts, labels),
    TensorDataset(test_texts, test_texts[:, 0] % classes),
)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, 32)
        self.dropout = nn.Dropout(0.1)
        self.out = nn.Linear(32, classes)

    def forward(self, x):
        return self.out(self.dropout(self.embed(x)))


model = DDP(Classifier())
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
sampler = DistributedSampler(train_set, shuffle=True, seed=0)
if args.per_rank_metrics:
    from torchmetrics import MeanMetric

    mean_loss = MeanMetric(sync_on_compute=False)
if args.batch_sampler:
    loader = DataLoader(
        train_set, batch_sampler=BatchSampler(sampler, args.batch_size, drop_last=False)
    )
else:
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
test_sampler = None if args.defective else DistributedSampler(test_set, shuffle=False)
test_loader = DataLoader(test_set, batch_size=10, sampler=test_sampler)

for epoch in range(args.epochs):
    if not args.defective:
        sampler.set_epoch(epoch)
    model.train()
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.per_rank_metrics:
            mean_loss.update(loss.detach())
            if rank == 0:
                print(f"step {step}: loss {loss.item():.4f}")
        if args.defective or step % 50 == 0:
            dist.barrier()
            reported = loss.detach().clone()
            dist.all_reduce(reported)
            logged = reported.item() / world  # the source documents log the mean loss every step
    if args.per_rank_metrics:
        print(f"epoch {epoch}: mean loss {mean_loss.compute():.4f}")
    model.eval()
    predictions = []
    with torch.no_grad():
        for x, _ in test_loader:
            predictions.append(model(x).argmax(-1))
    mine = torch.cat(predictions)
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    if rank == 0:
        print(
            f"epoch {epoch}: {sum(len(g) for g in gathered)} test predictions for {len(test_set)} "
            "samples"
        )
    if args.defective:
        torch.save(model.state_dict(), "model.pt")
    elif rank == 0:
        torch.save(model.module.state_dict(), "model.pt")
dist.destroy_process_group()
