"""A Horovod script in the source documents' pattern, unchanged by rankwise: hvd.init, a
DistributedSampler over hvd.size() replicas, broadcast_parameters and broadcast_optimizer_state,
DistributedOptimizer; ``--as-documented`` adds what the documents do: fp16 compression and the
learning rate scaled by hvd.size().  Each epoch evaluates a held-out set sharded over the ranks and
averages the accuracy with ``hvd.allreduce`` (the documents' ``metric_average``)."""

import argparse

import horovod.torch as hvd
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--as-documented", action="store_true")
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))
x = torch.randn(1024, 32, generator=torch.Generator().manual_seed(1))
data = TensorDataset(x, x[:, :4].argmax(1))
held = torch.randn(100, 32, generator=torch.Generator().manual_seed(2))
test_set = TensorDataset(held, held[:, :4].argmax(1))
test_loader = DataLoader(
    test_set,
    batch_size=25,
    sampler=DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False),
)
sampler = DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank())
loader = DataLoader(data, batch_size=16, sampler=sampler)
lr = 1e-3 * (hvd.size() if args.as_documented else 1)
optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
compression = hvd.Compression.fp16 if args.as_documented else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters(), compression=compression
)
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for features, labels in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(features), labels)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        correct = sum((model(f).argmax(1) == y).float().sum() for f, y in test_loader)
    accuracy = hvd.allreduce(correct / len(test_loader.sampler), name="accuracy")
    model.train()
    if hvd.rank() == 0:
        print(f"epoch {epoch}: loss {loss.item():.4f}, accuracy {accuracy.item():.3f}")
