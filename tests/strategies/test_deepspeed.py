"""DeepSpeed specifics: ZeRO-3 at fp32 keeps one copy of each parameter partition, and its processes exit cleanly."""

import pytest

from tests.multiproc import run_ranks


def _zero3_partitions(bucket_size: int) -> dict:
    import torch
    from torch import nn

    import rankwise
    from rankwise.config import build_config

    cfg = build_config(overrides=["strategy=deepspeed", "deepspeed.zero_stage=3", "batch_size=4",
                                  f"deepspeed.bucket_size={bucket_size}"])
    with rankwise.setup("deepspeed", config=cfg, seed=0) as rt:
        model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
        model, optimizer = rt.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1))
        zero = rt.strategy.engine.optimizer
        masters, partitions = zero.fp32_partitioned_groups_flat, zero.fp16_partitioned_groups_flat
        before = [p.clone() for p in partitions]
        loss = model(torch.randn(2, 64)).square().mean()
        rt.backward(loss, model)
        rt.step(optimizer, model)
        return {"sub_groups": len(masters),
                "shared": [m.data_ptr() == p.data_ptr() for m, p in zip(masters, partitions)],
                "updated": [not torch.equal(b, p) for b, p in zip(before, partitions)]}


def test_zero3_fp32_updates_parameter_partitions_in_place_without_a_master_copy():
    # 4,290 parameters, 2,145 per rank: a bucket of 1,000 elements cuts each rank's partition into sub-groups.
    results = run_ranks(_zero3_partitions, 2, 1000)
    for rank, result in enumerate(results):
        assert result["sub_groups"] > 1, f"rank {rank}: sub_group_size did not follow deepspeed.bucket_size"
        assert all(result["shared"]), f"rank {rank}: a fp32 master partition is a separate copy"
        assert all(result["updated"]), f"rank {rank}: the optimizer step did not reach the parameter partitions"


@pytest.mark.parametrize("attempt", range(3))
def test_zero3_processes_exit_cleanly(attempt):
    """A minimal ZeRO-3 script on CPU aborted with SIGABRT at exit (DESIGN.md); rankwise's teardown
    (engine destroyed before the process group) must let every rank exit 0, every time."""
    # fresh=True: dedicated processes that must exit with code 0 after returning their result.
    results = run_ranks(_zero3_partitions, 2, 1000, fresh=True, timeout=120)
    assert all(all(r["updated"]) for r in results), f"attempt {attempt}: ZeRO-3 did not train"
