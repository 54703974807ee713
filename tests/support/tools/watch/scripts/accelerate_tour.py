"""Accelerate's quick-tour loop, as its documentation writes it, on a small classifier.

``--batch-norm`` puts a BatchNorm layer in the model (statistics over each rank's share of the
batch). ``--scheduler`` adds a linear warm-up schedule stepped after the optimizer, as the quick
tour does.
"""

import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-norm", action="store_true")
parser.add_argument("--scheduler", action="store_true")
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

set_seed(0)
accelerator = Accelerator()
features = torch.randn(96, 16, generator=torch.Generator().manual_seed(1))
targets = (features[:, 0] > 0).long()
training_dataloader = DataLoader(
    TensorDataset(features[:64], targets[:64]), batch_size=8, shuffle=True
)
eval_dataloader = DataLoader(TensorDataset(features[64:], targets[64:]), batch_size=8)

layers = [nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2)]
if args.batch_norm:
    layers.insert(1, nn.BatchNorm1d(32))
model = nn.Sequential(*layers)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
loss_function = nn.CrossEntropyLoss()

model, optimizer, training_dataloader, eval_dataloader, scheduler = accelerator.prepare(
    model, optimizer, training_dataloader, eval_dataloader, scheduler
)

for epoch in range(args.epochs):
    model.train()
    for batch in training_dataloader:
        optimizer.zero_grad()
        inputs, labels = batch
        outputs = model(inputs)
        loss = loss_function(outputs, labels)
        accelerator.backward(loss)
        optimizer.step()
        if args.scheduler:
            scheduler.step()
    model.eval()
    correct = total = 0
    for inputs, labels in eval_dataloader:
        with torch.no_grad():
            predictions = model(inputs).argmax(-1)
        predictions, references = accelerator.gather_for_metrics((predictions, labels))
        correct += int((predictions == references).sum())
        total += len(references)
    accelerator.print(
        f"epoch {epoch}: accuracy {correct / total:.3f} over {total} samples (world size "
        f"{accelerator.num_processes})"
    )
