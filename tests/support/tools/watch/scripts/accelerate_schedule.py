"""Accelerate's ``nlp_example.py`` loop on a tiny classifier: AdamW at lr 2e-5 and transformers'
linear warm-up schedule (100 warm-up steps, the training steps counted from the loader before
``accelerator.prepare``), built before ``accelerator.prepare`` and stepped after every optimizer
step, as nlp_example does.

As written, Accelerate steps the schedule ``num_processes`` times per optimizer step, so on 2 ranks
the learning rate runs twice one process's (4e-7, 8e-7 ... against 2e-7, 4e-7 ...): weights apart
by ~1e-7, updates by 100 %.

``--fix counts``: the warm-up counted in per-process batches (``100 * num_processes``), as
Accelerate's performance guide says; ``--fix manual``: ``Accelerator(step_scheduler_with_optimizer=
False)`` and the schedule stepped once per optimizer step by hand.  ``--lr-factor F``: the N ranks
(not one process) train at lr x F, no schedule (the smallest change the criterion catches).
"""

import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from transformers import get_linear_schedule_with_warmup

parser = argparse.ArgumentParser()
parser.add_argument("--fix", choices=["counts", "manual"])
parser.add_argument("--lr-factor", type=float)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

set_seed(0)
accelerator = Accelerator(step_scheduler_with_optimizer=args.fix != "manual")
features = torch.randn(96, 16, generator=torch.Generator().manual_seed(1))
targets = (features[:, 0] > 0).long()
train_dataloader = DataLoader(
    TensorDataset(features[:64], targets[:64]), batch_size=8, shuffle=True
)
eval_dataloader = DataLoader(TensorDataset(features[64:], targets[64:]), batch_size=8)

model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 2))
lr = 2e-5
if args.lr_factor and accelerator.num_processes > 1:
    lr *= args.lr_factor
optimizer = torch.optim.AdamW(params=model.parameters(), lr=lr)
warmup = 100 * (accelerator.num_processes if args.fix == "counts" else 1)
lr_scheduler = (
    None
    if args.lr_factor
    else get_linear_schedule_with_warmup(
        optimizer=optimizer,
        num_warmup_steps=warmup,
        num_training_steps=len(train_dataloader) * args.epochs,
    )
)
model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
)

for epoch in range(args.epochs):
    model.train()
    for inputs, labels in train_dataloader:
        loss = nn.functional.cross_entropy(model(inputs), labels)
        accelerator.backward(loss)
        optimizer.step()
        if lr_scheduler is not None:
            lr_scheduler.step()
        optimizer.zero_grad()
    model.eval()
    correct = total = 0
    for inputs, labels in eval_dataloader:
        with torch.no_grad():
            predictions = model(inputs).argmax(-1)
        predictions, references = accelerator.gather_for_metrics((predictions, labels))
        correct += int((predictions == references).sum())
        total += len(references)
    accelerator.print(f"epoch {epoch}: accuracy {correct / total:.3f} over {total} samples")
