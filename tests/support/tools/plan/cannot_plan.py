"""Plain torch scripts rankwise plan cannot run, each for a reason of its own, for its one-line
error: ``--fail value`` checks a parameter's values before training (``if
torch.isnan(weight).any()``: a fake parameter has none; a ``.item()`` there would read 0);
``--fail replay`` trains a model whose forward keeps the rows of an activation that pass a test
(``x[keep]``: a shape that depends on values), which the capture never runs (it stops before the
forward) and the replay on fake tensors cannot.  (A value the forward only reads, ``if
x.max().item() > 100``, is answered 0 in the replay: ``rankwise.tools.plan.reads``.)"""

import argparse

import torch
from torch import nn


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 2)

    def forward(self, x):
        x = x[x.abs().amax(dim=1) < 100]  # FAILS IN THE REPLAY
        return self.layer(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail", choices=("value", "replay"), required=True)
    args = parser.parse_args()
    model = Gated()
    if args.fail == "value":
        if torch.isnan(model.layer.weight).any():  # FAILS BEFORE
            raise SystemExit("a NaN in the initial weights")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        loss = model(torch.randn(4, 8)).sum()  # THE TRAINING STEP
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
