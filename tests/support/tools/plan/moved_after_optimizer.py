"""A plain torch script that moves or casts its model AFTER building its optimizer (as many scripts
do: ``opt = AdamW(model.parameters()); model.to(device, dtype=torch.bfloat16)``), for rankwise
plan's capture.  torch's own ``Module._apply`` keeps each parameter object through such a move, so
the optimizer still steps the model's parameters.

``--move``: how the model is moved (``to-device-dtype``: ``.to(device, dtype=bfloat16)``;
``to-dtype``: ``.to(torch.bfloat16)``; ``half``: ``.half()``; ``to-device``: ``.to(device)``;
``cuda``: ``.cuda()`` where ``--device cuda``, else ``.to(device)``)."""

import argparse

import torch
from torch import nn

MOVES = ("to-device-dtype", "to-dtype", "half", "to-device", "cuda")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--move", choices=MOVES, default="to-device-dtype")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dtype = torch.float32
    if args.move == "to-device-dtype":
        model.to(device, dtype=torch.bfloat16)
        dtype = torch.bfloat16
    elif args.move == "to-dtype":
        model.to(torch.bfloat16)
        dtype = torch.bfloat16
    elif args.move == "half":
        model.half()
        dtype = torch.float16
    elif args.move == "cuda" and device.type == "cuda":
        model.cuda()
    else:
        model.to(device)
    for _ in range(3):
        x = torch.randn(8, 16, dtype=dtype).to(device)
        y = torch.randint(0, 4, (8,)).to(device)
        loss = nn.functional.cross_entropy(model(x).float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
