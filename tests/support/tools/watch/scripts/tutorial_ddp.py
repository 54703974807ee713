"""A DDP script in the style of PyTorch's DDP tutorial series (a ``Trainer`` class, a random
dataset, snapshots), edited as a user without a GPU edits it (gloo, CPU); torchrun starts it.

``--defective`` keeps what such a script does as written: its dataset is drawn with ``torch.rand``
in every process without a seed (index i is other data on every rank and in every run), its model is
built unseeded, and ``F.cross_entropy`` of a one-column output is identically zero (nothing trains).
The fixed form seeds both and trains a regression with ``F.mse_loss``; ``--zero-loss`` seeds both
and keeps the zero loss.  Library defaults: SGD at the tutorial's learning rate.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size, generator=None):
        self.size = size
        self.data = [
            (torch.rand(20, generator=generator), torch.rand(1, generator=generator))
            for _ in range(size)
        ]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, zero_loss, fail_at_save=False):
        self.model, self.fail_at_save = DDP(model), fail_at_save
        self.train_data, self.optimizer, self.save_every = train_data, optimizer, save_every
        self.loss = F.cross_entropy if zero_loss else F.mse_loss

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = self.loss(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    def _save_snapshot(self, epoch):
        if self.fail_at_save:
            raise OSError(28, "No space left on device", "snapshot.pt")
        torch.save(
            {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}, "snapshot.pt"
        )

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
            if dist.get_rank() == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def main(total_epochs, save_every, batch_size, defective, zero_loss, fail_at_save):
    dist.init_process_group("gloo")
    generator = None if defective else torch.Generator().manual_seed(0)
    dataset = MyTrainDataset(2048, generator)
    if not defective:
        torch.manual_seed(0)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=True,
        shuffle=False,
        sampler=DistributedSampler(dataset),
    )
    Trainer(model, loader, optimizer, save_every, defective or zero_loss, fail_at_save).train(
        total_epochs
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("--total-epochs", type=int, default=3)
    parser.add_argument("--save-every", type=int, default=1)
    parser.add_argument(
        "--batch-size", type=int, default=32, help="input batch size on each device"
    )
    parser.add_argument("--defective", action="store_true")
    parser.add_argument("--zero-loss", action="store_true")
    parser.add_argument(
        "--fail-at-save", action="store_true", help="the first snapshot fails (a full disk)"
    )
    args = parser.parse_args()
    main(
        args.total_epochs,
        args.save_every,
        args.batch_size,
        args.defective,
        args.zero_loss,
        args.fail_at_save,
    )
