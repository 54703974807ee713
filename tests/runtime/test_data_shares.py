"""The first step tells whether the ranks trained on their own shares: a plain DataLoader warns
once, on rank 0."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.support.multiproc import run_ranks

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)


def _one_step(loader: str) -> list[str]:
    import rankwise

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("rankwise").addHandler(handler)
    try:
        with rankwise.setup("ddp", seed=0) as rt:
            model, optimizer = rt.prepare(torch.nn.Linear(4, 2), None)
            data = TensorDataset(torch.randn(32, 4), torch.randn(32, 2))
            batches = (
                DataLoader(data, batch_size=4)
                if loader == "plain"
                else rt.loader(data, batch_size=8)
            )
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step, (x, y) in enumerate(batches):
                x, y = rt.to_device((x, y))
                rt.backward(torch.nn.functional.mse_loss(model(x), y), model)
                rt.step(optimizer, model)
                rt.zero_grad(optimizer)
                if step == 2:
                    break
    finally:
        logging.getLogger("rankwise").removeHandler(handler)
    return records


@pytest.mark.parametrize(("loader", "warned"), [("plain", True), ("rt.loader", False)])
def test_ranks_that_trained_on_the_same_samples_are_told_once_by_rank_0(loader, warned):
    said_0, said_1 = run_ranks(_one_step, 2, loader)
    assert said_1 == []
    assert len(said_0) == (1 if warned else 0), said_0
    if warned:
        assert "all 2 ranks trained on the same 4 samples in the first step" in said_0[0]
        assert "rt.loader(dataset, batch_size=GLOBAL_BATCH)" in said_0[0]
