"""A text classifier in hand-written DDP, in the source documents' style, over several epochs
(torchrun starts it).

Its mistakes (``--defective``) show only after the first epoch and after training: no
``sampler.set_epoch``, every rank evaluating the whole test set after each epoch and gathering the
predictions (each counted twice at 2 ranks), every rank saving the DDP wrapper's ``state_dict()``
(``module.`` keys) to one file at the end.  The fixed form shards evaluation and gathers it once,
calls ``set_epoch`` and saves ``model.module`` on rank 0.  Library defaults: AdamW's own settings,
dropout 0.1 as a module; a barrier and a logged loss all-reduce every step, as the documents do (the
defective form reads the logged loss back every step).
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--defective", action="store_true")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=8, help="per rank")
parser.add_argument("--train-samples", type=int, default=320)
parser.add_argument("--test-samples", type=int, default=40)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)

vocab, length, classes = 300, 16, 6
texts = torch.randint(
    1, vocab, (args.train_samples, length), generator=torch.Generator().manual_seed(1)
)
labels = texts[:, 0] % classes
test_texts = torch.randint(
    1, vocab, (args.test_samples, length), generator=torch.Generator().manual_seed(2)
)
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
loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
test_sampler = None if args.defective else DistributedSampler(test_set, shuffle=False)
test_loader = DataLoader(test_set, batch_size=10, sampler=test_sampler)

for epoch in range(args.epochs):
    if not args.defective:
        sampler.set_epoch(epoch)
    model.train()
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        dist.barrier()
        reported = loss.detach().clone()
        dist.all_reduce(reported)
        if args.defective:
            logged = reported.item() / world
    model.eval()
    predictions, targets = [], []
    with torch.no_grad():
        for x, y in test_loader:
            predictions.append(model(x).argmax(-1))
            targets.append(y)
    mine = torch.stack([torch.cat(predictions), torch.cat(targets)])
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    every = torch.cat(gathered, dim=1)
    if rank == 0:
        accuracy = (every[0] == every[1]).float().mean().item()
        print(f"epoch {epoch}: accuracy {accuracy:.3f} over {every.shape[1]} test predictions")
if args.defective:
    torch.save(model.state_dict(), "model.pt")
elif rank == 0:
    torch.save(model.module.state_dict(), "model.pt")
dist.destroy_process_group()
