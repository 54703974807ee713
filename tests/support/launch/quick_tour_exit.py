"""Accelerate's quick tour as a user writes it, whole: a main(), ``prepare``,
``accelerator.backward``, ``gather_for_metrics`` in each evaluation, rank 0 saving with
``accelerator.save``, then ``end_training()``.

The pattern an issue reporter saw hang at exit in 4 of 10 two-rank runs (``scripts/exit_stress.py``
counts how its runs end).  ``ACCELERATE_USE_CPU=true`` on a machine without GPUs; the weights go to
DIR/model.pt.
"""

import sys

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    accelerator = Accelerator()
    features = torch.randn(256, 16)
    targets = (features[:, 0] > 0).long()
    train = DataLoader(TensorDataset(features[:192], targets[:192]), batch_size=8, shuffle=True)
    evaluation = DataLoader(TensorDataset(features[192:], targets[192:]), batch_size=8)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)
    for epoch in range(2):
        model.train()
        for inputs, labels in train:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
        model.eval()
        correct = total = 0
        for inputs, labels in evaluation:
            with torch.no_grad():
                predictions = model(inputs).argmax(-1)
            predictions, references = accelerator.gather_for_metrics((predictions, labels))
            correct += int((predictions == references).sum())
            total += len(references)
        accelerator.print(f"epoch {epoch}: accuracy {correct / total:.3f}")

    if accelerator.is_main_process:
        accelerator.save(accelerator.unwrap_model(model).state_dict(), sys.argv[1] + "/model.pt")
    accelerator.end_training()


if __name__ == "__main__":
    main()
