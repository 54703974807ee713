"""A plain single-device torch training script (no rankwise), for rankwise plan's capture: an MLP on
random data, its loss computed outside the model, a loss value read on every step."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=24)
    parser.add_argument(
        "--never-train", action="store_true", help="evaluate only: nothing for the plan to capture"
    )
    parser.add_argument(
        "--evaluate-first",
        action="store_true",
        help="read the loss before training, as nanoGPT's estimate_loss does (.item())",
    )
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = DataLoader(
        TensorDataset(torch.randn(96, 32), torch.randint(0, 4, (96,))),
        batch_size=args.batch_size,
        shuffle=True,
    )
    if args.evaluate_first:
        with torch.no_grad():
            x, y = next(iter(data))
            print(f"loss before training {nn.functional.cross_entropy(model(x), y).item():.3f}")
    if args.never_train:
        with torch.no_grad():
            for x, _ in data:
                model(x.to(device))
        return
    for x, y in data:
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
