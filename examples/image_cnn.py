"""A small convolutional network on synthetic 16x16 images, on rankwise's public API.

The class of an image is which quadrant holds a bright blob; nothing in the script names a
strategy, so the launcher chooses:

    python examples/image_cnn.py
    rankwise launch --nproc-per-node 2 --strategy accelerate examples/image_cnn.py
    rankwise launch --nproc-per-node 2 --strategy fsdp examples/image_cnn.py --optimizer adam

``--batch-norm`` adds BatchNorm layers: each rank then normalises over its own part of the
global batch, so the run no longer computes what one process computes (`rankwise verify`
names that; on GPUs ``torch.nn.SyncBatchNorm`` makes it whole again).
"""

import argparse
import json
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import rankwise


def blob_images(samples: int, size: int = 16, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (samples,), generator=generator)
    images = 0.3 * torch.randn(samples, 1, size, size, generator=generator)
    half = size // 2
    for i, label in enumerate(labels.tolist()):
        row, col = divmod(label, 2)
        images[i, 0, row * half : (row + 1) * half, col * half : (col + 1) * half] += 1.0
    return TensorDataset(images, labels)


def cnn(batch_norm: bool) -> nn.Module:
    norm = (
        (lambda channels: nn.BatchNorm2d(channels))
        if batch_norm
        else (lambda channels: nn.Identity())
    )
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        norm(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        norm(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 4),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--optimizer",
        choices=("sgd", "adam"),
        default="sgd",
        help="sgd: SGD with momentum 0.9 at --lr; adam: torch's Adam at its defaults",
    )
    parser.add_argument("--lr", type=float, default=1e-2, help="SGD's learning rate")
    parser.add_argument("--batch-norm", action="store_true")
    parser.add_argument(
        "--out", default="runs/image-cnn", help="where rank 0 saves weights and a summary"
    )
    args = parser.parse_args(argv)

    dataset = blob_images(args.samples)
    with rankwise.setup(seed=0) as rt:  # the strategy comes from the launcher
        model = cnn(args.batch_norm)
        if args.optimizer == "adam":
            optimizer = torch.optim.Adam(model.parameters())
        else:
            optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        model, optimizer = rt.prepare(
            model, optimizer, micro_batch_size=args.batch_size // rt.world_size
        )
        loader = rt.loader(dataset, batch_size=args.batch_size, shuffle=True)
        step, epoch = 0, 0
        while step < args.steps:
            rt.set_epoch(loader, epoch)
            for images, labels in loader:
                images, labels = rt.to_device((images, labels))
                with rt.autocast():
                    loss = nn.functional.cross_entropy(model(images), labels)
                rt.backward(loss, model)
                rt.step(optimizer, model)
                rt.zero_grad(optimizer)
                step += 1
                if step == args.steps:
                    break
            epoch += 1
        # Why: one all-reduce at the end, only to print the loss averaged over ranks.
        mean_loss = rt.all_reduce(loss.detach().float(), "mean").item()
        rt.print(
            f"step {step}: loss {mean_loss:.4f} ({rt.strategy_name}, {rt.world_size} processes)"
        )
        out = Path(args.out)
        rt.save_weights(model, out / "model.safetensors")
        if rt.is_main:
            summary = {
                "world_size": rt.world_size,
                "strategy": rt.strategy_name,
                "steps": step,
                "loss": mean_loss,
            }
            (out / "summary.json").write_text(json.dumps(summary), encoding="utf-8")


if __name__ == "__main__":
    main()
