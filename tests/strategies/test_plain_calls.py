"""What a PyTorch user types — loss.backward(), optimizer.step(), optimizer.zero_grad() — on the
objects rt.prepare returned: under every strategy it either trains (the loss falls) or raises at the
first step with the fix. Under deepspeed-zero2 it used to change nothing for 3 epochs (loss 1.4261
-> 1.4277), exit 0."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tests.support.multiproc import run_ranks

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)


def _plain(strategy: str, backward: str) -> tuple[list[float], str | None]:
    """One rank: 12 steps typed as in a plain PyTorch loop (``backward``: "plain" or "rt"); the
    losses, or the error the first step raised."""
    import rankwise

    with rankwise.setup(strategy, seed=0) as rt:
        model = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 3))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, optimizer = rt.prepare(model, optimizer, micro_batch_size=8)
        g = torch.Generator().manual_seed(3)
        x, y = torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g)
        losses = []
        for step, (xb, yb) in enumerate(rt.loader(TensorDataset(x, y), batch_size=16)):
            xb, yb = rt.to_device((xb, yb))
            loss = nn.functional.cross_entropy(model(xb), yb)
            try:
                if backward == "plain":
                    loss.backward()
                else:
                    rt.backward(loss, model)
                optimizer.step()
            except RuntimeError as e:
                return losses, str(e)
            optimizer.zero_grad()
            losses.append(rt.all_reduce(loss.detach(), "mean").item())
            if step == 2:
                break
        for _ in range(3):  # more epochs of the same batches
            for xb, yb in rt.loader(TensorDataset(x, y), batch_size=16):
                xb, yb = rt.to_device((xb, yb))
                loss = nn.functional.cross_entropy(model(xb), yb)
                loss.backward() if backward == "plain" else rt.backward(loss, model)
                optimizer.step()
                optimizer.zero_grad()
        losses.append(
            rt.all_reduce(
                nn.functional.cross_entropy(model(rt.to_device(x)), rt.to_device(y)).detach(),
                "mean",
            ).item()
        )
        return losses, None


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "accelerate"])
def test_plain_calls_train_where_the_strategy_allows_them(strategy):
    (losses, error), _ = run_ranks(_plain, 2, strategy, "plain")
    assert error is None
    assert losses[-1] < losses[0] - 0.05, losses


@pytest.mark.parametrize("strategy", ["deepspeed-zero2", "deepspeed-zero3"])
@pytest.mark.parametrize(
    ("backward", "fix"),
    [("plain", "rt.backward(loss, model)"), ("rt", "rt.step(optimizer, model) instead")],
)
def test_plain_calls_under_zero_raise_at_the_first_step_with_the_fix(strategy, backward, fix):
    (losses, error), (_, error_1) = run_ranks(_plain, 2, strategy, backward)
    assert losses == [] and error is not None and error == error_1, (losses, error)
    assert fix in error, error
