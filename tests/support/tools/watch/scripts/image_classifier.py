"""A new user's image classifier in hand-written DDP (torchrun starts it): SGD with momentum, a
learning rate scheduled every optimizer step, label smoothing, gradient accumulation over 2 batches,
validation each epoch, ``torch.save`` at the end.

``--defective``: validation accuracy is computed on rank 0 from rank 0's shard of the validation set
only and printed as the whole set's.  The fixed form sums the correct predictions and the count over
the ranks first. Library defaults: SGD's own dampening and no weight decay, OneCycleLR's own
schedule, dropout 0.2 as a module.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--defective", action="store_true")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--accumulate", type=int, default=2)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)

images = torch.randn(256, 3, 12, 12, generator=torch.Generator().manual_seed(1))
classes = (images.mean(dim=(1, 2, 3)) * 40).long().clamp(-5, 4) + 5
val_images = torch.randn(64, 3, 12, 12, generator=torch.Generator().manual_seed(2))
val_classes = (val_images.mean(dim=(1, 2, 3)) * 40).long().clamp(-5, 4) + 5
train_set, val_set = TensorDataset(images, classes), TensorDataset(val_images, val_classes)

net = nn.Sequential(
    nn.Conv2d(3, 16, 3),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3),
    nn.ReLU(),
    nn.AdaptiveAvgPool2d(1),
    nn.Flatten(),
    nn.Dropout(0.2),
    nn.Linear(32, 10),
)
model = DistributedDataParallel(net)
train_sampler = DistributedSampler(train_set, shuffle=True)
train_loader = DataLoader(train_set, batch_size=8, sampler=train_sampler)
val_loader = DataLoader(val_set, batch_size=16, sampler=DistributedSampler(val_set, shuffle=False))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
steps_per_epoch = len(train_loader) // args.accumulate
scheduler = torch.optim.lr_scheduler.OneCycleLR(
    optimizer, max_lr=0.05, total_steps=args.epochs * steps_per_epoch
)
criterion = nn.CrossEntropyLoss(label_smoothing=0.1)

for epoch in range(args.epochs):
    train_sampler.set_epoch(epoch)
    model.train()
    for i, (x, y) in enumerate(train_loader):
        loss = criterion(model(x), y) / args.accumulate
        loss.backward()
        if (i + 1) % args.accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
    model.eval()
    correct, total = torch.zeros(()), torch.zeros(())
    with torch.no_grad():
        for x, y in val_loader:
            correct += (model(x).argmax(1) == y).sum()
            total += len(y)
    if not args.defective:
        counts = torch.stack([correct, total])
        dist.all_reduce(counts)
        correct, total = counts
    if rank == 0:
        print(f"epoch {epoch}: validation accuracy {correct / total:.3f} ({int(total)} images)")
if rank == 0:
    torch.save(model.module.state_dict(), "classifier.pt")
dist.destroy_process_group()
