"""DDP's own behaviour: one gradient synchronisation per optimizer step, buffers broadcast only when
they change."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from rankwise.strategies.ddp import broadcast_buffers, changing_buffers
from rankwise.strategies.options import DDPOptions
from tests.support.multiproc import run_ranks


def _count_bucket_syncs(strategy: str, grad_accum: int, steps: int) -> tuple[int, int, bool]:
    """One rank: ``steps`` optimizer steps of ``grad_accum`` micro-batches; DDP's bucket all-reduces
    counted."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    import rankwise

    with rankwise.setup(strategy, seed=0) as rt:
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, optimizer = rt.prepare(
                model, optimizer, grad_accum=grad_accum, micro_batch_size=4
            )
        warned = [
            str(w.message)
            for w in caught
            if issubclass(w.category, (FutureWarning, DeprecationWarning))
        ]
        ddp = model if isinstance(model, nn.parallel.DistributedDataParallel) else model.module
        calls = []

        def counting(group, bucket):
            calls.append(bucket.index())
            return default_hooks.allreduce_hook(group, bucket)

        ddp.register_comm_hook(None, counting)
        for _ in range(steps):
            for micro in range(grad_accum):
                last = micro == grad_accum - 1
                with rt.no_sync(model, enabled=not last):
                    rt.backward(model(torch.randn(4, 8)).square().mean() / grad_accum, model)
            rt.step(optimizer, model)
            rt.zero_grad(optimizer)
        return len(calls), len(set(calls)), ddp.will_sync_module_buffers(), warned


@pytest.mark.multiproc
@pytest.mark.parametrize("strategy", ["ddp", "accelerate"])
def test_accumulation_synchronises_once_per_optimizer_step(strategy):
    syncs, buckets, broadcasting, warned = run_ranks(
        _count_bucket_syncs, 2, strategy, 4, 3, timeout=120
    )[0]
    # not 12: the first three micro-batches of each step skip the all-reduce
    assert buckets == 1 and syncs == 3
    assert broadcasting is False  # no buffers: nothing to broadcast at each forward
    # torch 2.13 warns once per rank for the deprecated broadcast_buffers keyword
    assert warned == []


def test_buffers_are_broadcast_only_when_training_can_change_them():
    bert_like = nn.Embedding(10, 4)
    bert_like.register_buffer("position_ids", torch.arange(10), persistent=False)
    normed = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    assert changing_buffers(bert_like) == []
    assert changing_buffers(normed) == ["1.running_mean", "1.running_var", "1.num_batches_tracked"]
    auto = DDPOptions()
    assert not broadcast_buffers(bert_like, auto) and broadcast_buffers(normed, auto)
    assert broadcast_buffers(bert_like, DDPOptions(broadcast_buffers="always"))
    assert not broadcast_buffers(normed, DDPOptions(broadcast_buffers="never"))
