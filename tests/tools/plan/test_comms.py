"""The collectives the plan counts for a step, against the calls real ranks make on gloo."""

from __future__ import annotations

from collections import Counter
from functools import partial

import pytest
import torch

from rankwise.tools.plan.capture import from_factory
from rankwise.tools.plan.comms import collectives
from rankwise.tools.plan.fake_step import trace
from tests.support.tools.plan.accounting_model import ROWS, WIDTH, build

WIDE = 256
"""A width at which the blocks' weights (262,144 elements) are above ZeRO-3's persistence
threshold: partitioned, gathered when used."""
SMALL = {"bucket_size": "300000", "max_live_parameters": "600000"}
"""ZeRO-3's prefetch bucket and live parameters below the model's 1.8M elements: several gathers
a pass, and released parameters gathered again in the backward."""
CASES = {
    "ddp": ("ddp", None, None, WIDTH),
    "fsdp": ("fsdp", None, None, WIDTH),
    "fsdp, clipped": ("fsdp", None, 1.0, WIDTH),
    "deepspeed-zero2": ("deepspeed", {"zero_stage": "2"}, None, WIDTH),
    "deepspeed-zero3": ("deepspeed", {"zero_stage": "3"}, None, WIDTH),
    "deepspeed-zero3, partitioned": ("deepspeed", {"zero_stage": "3"}, None, WIDE),
    "deepspeed-zero3, partitioned, small buckets": (
        "deepspeed",
        {"zero_stage": "3", **SMALL},
        None,
        WIDE,
    ),
}


def _counted(
    strategy: str, options: dict | None, max_norm: float | None, width: int
) -> dict[str, int]:
    """One rank: the third step (forward, backward, optimizer step), its gloo calls counted by
    torch's profiler (every collective shows there, DTensor's functional ones too).  The third: the
    second is not yet steady, DDP broadcasting its rebuilt buckets' order (2 broadcasts) and ZeRO-3
    6 in its forward, once."""
    import rankwise

    with rankwise.setup(strategy, options=options, seed=0) as rt:
        model, optimizer = rt.prepare(*build(width))
        for _ in range(3):
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU]
            ) as profile:
                loss = model(torch.randn(ROWS, width)).float().square().mean()
                rt.backward(loss, model)
                rt.step(optimizer, model, max_norm=max_norm)
            optimizer.zero_grad()
    names = Counter(event.name for event in profile.events())
    return {name.removeprefix("gloo:"): n for name, n in names.items() if name.startswith("gloo:")}


@pytest.mark.multiproc
def test_each_strategys_planned_collectives_are_the_calls_its_ranks_make():
    """DDP: one all-reduce per bucket.  FSDP2: a gather per unit before its forward and before its
    backward (not the root's), a reduce-scatter per unit, and with clipping one all-reduce of the
    norm. ZeRO-2: one reduction bucket, the norm every step, one gather per parameter group. ZeRO-3
    on a model whose parameters are all below the persistence threshold: no layer gathered, and
    each parameter gathered after the step; with partitioned weights, the gathers DeepSpeed's
    coordinator makes (prefetched in one call when they fit its bucket, kept for the backward while
    they fit its live parameters; else several a pass, and the released ones again in the
    backward). (gloo has no reduce-scatter: each shows as an all_reduce.)"""
    from tests.support.multiproc import run_ranks

    # (a fresh pair of processes each: DeepSpeed keeps state from one engine to the next)
    real = {
        case: run_ranks(_counted, 2, *settings, timeout=120, fresh=True)[0]
        for case, settings in CASES.items()
    }
    for case, (strategy, options, max_norm, width) in CASES.items():
        fp32 = trace(from_factory(partial(build, width), (torch.randn(ROWS, width),)), ROWS)
        name = strategy if options is None else f"deepspeed-zero{options['zero_stage']}"
        sizes = {
            "bucket": int(SMALL["bucket_size"]),
            "max_live": int(SMALL["max_live_parameters"]),
        }
        planned: Counter[str] = Counter()
        for call in collectives(
            name, fp32, 2, 1, clips=max_norm is not None, **(sizes if "small" in case else {})
        ):
            planned["all_reduce" if call.op == "reduce_scatter" else call.op] += call.calls
        assert real[case] == dict(planned), case  # (broadcasts too: none in a steady step)
    assert real["fsdp, clipped"]["all_reduce"] == real["fsdp"]["all_reduce"] + 1
