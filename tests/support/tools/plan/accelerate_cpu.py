"""Accelerate's quick-tour loop on the CPU, as the DESIGN's measured facts say a CPU job must write
it: ``Accelerator(cpu=True)`` (without it, torchrun's processes each train alone), for rankwise
plan's capture.  Under torchrun Accelerate then starts a gloo group (MULTI_CPU); at one process it
runs plain."""

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

set_seed(0)
accelerator = Accelerator(cpu=True)
features = torch.randn(96, 16, generator=torch.Generator().manual_seed(1))
targets = (features[:, 0] > 0).long()
training_dataloader = DataLoader(
    TensorDataset(features[:64], targets[:64]), batch_size=8, shuffle=True
)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_function = nn.CrossEntropyLoss()
model, optimizer, training_dataloader = accelerator.prepare(model, optimizer, training_dataloader)

for epoch in range(2):
    model.train()
    for inputs, labels in training_dataloader:
        optimizer.zero_grad()
        loss = loss_function(model(inputs), labels)
        accelerator.backward(loss)
        optimizer.step()
    accelerator.print(f"epoch {epoch}: loss {loss.item():.3f}")
