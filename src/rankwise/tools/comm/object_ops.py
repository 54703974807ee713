"""The operations of ``rankwise comm demo`` that move no tensor of the caller's: the object
collectives (pickled; torch builds them on the tensor collectives) and the barrier."""

from __future__ import annotations

import time

import torch
import torch.distributed as torch_dist

from rankwise.tools.comm.context import (
    ROOT,
    Ctx,
    Outcome,
)


def barrier(c: Ctx) -> Outcome:
    # A barrier is checked by what it promises: after it, every rank has arrived. Arrivals are
    # counted in the job's store (not by a collective) and staggered so a no-op barrier would show.
    store = torch_dist.distributed_c10d._get_default_store()
    key = "rankwise/comm-demo/barrier"
    time.sleep(0.05 * c.rank)
    arrived = store.add(key, 1)

    def composed() -> None:
        torch_dist.all_reduce(torch.zeros(1, device=c.device))

    c.call(torch_dist.barrier, composed, "an all_reduce of one value")
    seen = store.add(key, 0)
    # Why: nobody may reuse the key (a second demo in the same job) before every rank has read it.
    torch_dist.barrier()
    everyone = f"{c.world_size}/{c.world_size} arrived"
    return Outcome(f"arrived {arrived}/{c.world_size}", f"{seen}/{c.world_size} arrived", everyone)


def _config_for(rank: int) -> dict:
    return {"from": rank, "seed": 1000 + rank}


def broadcast_object_list(c: Ctx) -> Outcome:
    box = [_config_for(c.rank), f"r{c.rank}"]
    before = list(box)
    torch_dist.broadcast_object_list(box, src=ROOT)
    return Outcome(before, box, [_config_for(ROOT), f"r{ROOT}"])


def all_gather_object(c: Ctx) -> Outcome:
    slots: list = [None] * c.world_size
    torch_dist.all_gather_object(slots, _config_for(c.rank))
    return Outcome(_config_for(c.rank), slots, [_config_for(r) for r in range(c.world_size)])


def gather_object(c: Ctx) -> Outcome:
    slots: list | None = [None] * c.world_size if c.rank == ROOT else None
    torch_dist.gather_object(_config_for(c.rank), slots, dst=ROOT)
    if c.rank != ROOT:
        return Outcome(_config_for(c.rank), "(unspecified)", None)
    return Outcome(_config_for(c.rank), slots, [_config_for(r) for r in range(c.world_size)])


def scatter_object_list(c: Ctx) -> Outcome:
    parts = [{"for": r, "shard": list(range(r + 1))} for r in range(c.world_size)]  # uneven sizes
    box: list = [None]
    torch_dist.scatter_object_list(box, parts if c.rank == ROOT else None, src=ROOT)
    return Outcome(parts if c.rank == ROOT else "(nothing)", box[0], parts[c.rank])
