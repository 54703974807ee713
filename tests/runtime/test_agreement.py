"""Every rank starts from rank 0's weights: a model built before `setup()` (each rank its own draw)
trains under fsdp and deepspeed-zero3 as under ddp, and rank 0 says once that the ranks had
differed."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tests.support.multiproc import run_ranks
from tests.support.strategies import strategies_for
from tests.support.tiers import starts_processes

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)

STRATEGIES = strategies_for("agreement")  # tests/support/strategies.py: COVERAGE


def _train(strategy: str) -> tuple[dict | None, list[str]]:
    """One rank: a model drawn with this rank's own seed before setup, three AdamW steps."""
    import rankwise

    # as an unseeded script: every rank its own
    torch.manual_seed(1000 + int(__import__("os").environ["RANK"]))
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("rankwise").addHandler(handler)
    try:
        with rankwise.setup(strategy, seed=0) as rt:
            optimizer = torch.optim.AdamW(model.parameters())
            prepared, optimizer = rt.prepare(model, optimizer, micro_batch_size=4)
            g = torch.Generator().manual_seed(3)
            data = TensorDataset(
                torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g)
            )
            for step, (x, y) in enumerate(rt.loader(data, batch_size=8)):
                x, y = rt.to_device((x, y))
                rt.backward(nn.functional.cross_entropy(prepared(x), y), prepared)
                rt.step(optimizer, prepared)
                rt.zero_grad(optimizer)
                if step == 2:
                    break
            weights = rt.state_dict(prepared)
            return ({k: v.clone() for k, v in weights.items()} if rt.is_main else None), records
    finally:
        logging.getLogger("rankwise").removeHandler(handler)


@pytest.fixture(scope="module")
@starts_processes()
def ddp_run():
    return run_ranks(_train, 2, "ddp")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_model_each_rank_drew_alone_trains_from_rank_0s_weights_under_every_strategy(
    strategy, ddp_run
):
    results = ddp_run if strategy == "ddp" else run_ranks(_train, 2, strategy)
    (weights, said), (_, said_by_1) = results
    reference = ddp_run[0][0]
    assert weights.keys() == reference.keys()
    difference = max((weights[k] - reference[k]).abs().max().item() for k in reference)
    # fsdp and ZeRO-3 kept their own draws: 0.5
    assert difference < 1e-5, f"{strategy}: {difference:.2e} from ddp"
    assert len(said) == 1 and "ranks 1 built other initial weights than rank 0" in said[0], said
    assert said_by_1 == []  # said once, by rank 0
