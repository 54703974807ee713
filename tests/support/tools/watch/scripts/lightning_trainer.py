"""A stock PyTorch Lightning script: a ``LightningModule`` trained by ``Trainer(strategy="ddp")``,
validated every epoch with ``self.log(..., sync_dist=True)``; started with torchrun as Lightning's
documentation starts it.

``--log-val-loss`` also logs the validation loss without ``sync_dist`` (each rank's own: Lightning
warns).  Its validation set has 251 samples: at 2 ranks the ``DistributedSampler`` Lightning adds
pads it to 252, so one sample is counted twice.  ``--even`` sizes the set for the ranks (256);
Lightning's own advice is to validate on one device.  Library defaults: AdamW's own settings,
dropout 0.1 as a module, Lightning's Trainer defaults.
"""

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--even", action="store_true")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--log-val-loss", action="store_true")
args = parser.parse_args()


def dataset(count: int, seed: int) -> TensorDataset:
    x = torch.randn(count, 16, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, (x[:, 0] > 0).long())


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        accuracy = (logits.argmax(-1) == y).float().mean()
        self.log("val_acc", accuracy, sync_dist=True)
        if args.log_val_loss:
            self.log("val_loss", nn.functional.cross_entropy(logits, y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())


L.seed_everything(0)
train = DataLoader(dataset(256, 1), batch_size=8, shuffle=True)
val = DataLoader(dataset(256 if args.even else 251, 2), batch_size=32)
trainer = L.Trainer(
    accelerator="cpu",
    devices=2,
    strategy="ddp",
    max_epochs=args.epochs,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(Classifier(), train, val)
