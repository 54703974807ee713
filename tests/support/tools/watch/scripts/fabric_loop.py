"""Lightning Fabric's own training loop (`fabric run` starts it), on a small classifier.

As Fabric's examples for `fabric run` (image_classifier/train_fabric.py) it never calls
``fabric.launch()``: Fabric takes the processes from the CLI, which it knows by ``LT_CLI_USED``.

``--batch-norm`` puts a BatchNorm layer in the model (statistics over each rank's share of the
batch).
"""

import argparse

import torch
from lightning_fabric import Fabric
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-norm", action="store_true")
args = parser.parse_args()

fabric = Fabric()
fabric.seed_everything(0)

features = torch.randn(128, 16, generator=torch.Generator().manual_seed(1))
targets = (features[:, 0] > 0).long()
layers = [nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2)]
if args.batch_norm:
    layers.insert(1, nn.BatchNorm1d(32))
model = nn.Sequential(*layers)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer = fabric.setup(model, optimizer)
dataloader = fabric.setup_dataloaders(
    DataLoader(TensorDataset(features, targets), batch_size=8, shuffle=True)
)

model.train()
for epoch in range(2):
    for inputs, labels in dataloader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), labels)
        fabric.backward(loss)
        optimizer.step()
    fabric.print(f"epoch {epoch}: loss {loss.item():.4f}")
