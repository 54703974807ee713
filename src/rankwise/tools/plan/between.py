"""What one collective call costs between two computations, on this machine as it is now: the
calibration of ``rankwise plan --validate`` for a CPU whose cores the ranks' threads all use.

``rankwise comm bench`` times collectives back to back, with every core free to run the collective's
transport threads.  In a training step on such a CPU the peer is computing when a call starts, and
gloo's transport thread waits for a core the computation holds: measured here at two ranks on a
quiet machine, a 4 KiB all-gather took 0.2 ms back to back and 0.8-0.9 ms more between two 1 ms
matrix products (an all-reduce 1.3-2.3 ms, a reduce-scatter 1.5-1.9 ms; 2-4 ms while other jobs
ran).  That cost, not the back-to-back latency, is what every call of a step pays on such a machine.

Each rank alternates :data:`ROUNDS` rounds of (compute) and (compute, then a call of :data:`MESSAGE`
bytes); a call's cost is the mean of the second minus the mean of the first, rounds interleaved so
that both see the same machine. Run at N ranks as ``rankwise launch --nproc-per-node N -m
rankwise.tools.plan.between OUT.json``; rank 0 writes ``{"world_size", "backend", "compute_ms",
"call_us": {op: microseconds}}``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from rankwise.tools.comm.ops import all_gather_tensor, reduce_scatter_tensor

OPS = ("all_reduce", "all_gather", "reduce_scatter")
MESSAGE = 4096
"""Bytes of each call: small, so the cost is the call's, not the bytes' (the bandwidth model adds
those)."""
ROUNDS = 40
WARMUP = 5
FILE = "between.json"
"""The result's name, beside the ``comm.json`` it calibrates with
(:func:`~rankwise.tools.plan.comms.from_comm_bench` reads it)."""


def _call(op: str, world: int) -> Callable[[], None]:
    elements = MESSAGE // 4
    message, gathered, part = (
        torch.zeros(elements),
        torch.zeros(elements * world),
        torch.zeros(elements // world),
    )
    if op == "all_reduce":
        return lambda: dist.all_reduce(message)
    if op == "all_gather":
        return lambda: all_gather_tensor(gathered, message)
    return lambda: reduce_scatter_tensor(part, message)


def call_costs(world: int) -> tuple[dict[str, float], float]:
    """Seconds each operation's call costs between computations, and the seconds of one
    computation."""
    matrix = torch.randn(192, 192)

    def compute() -> None:
        for _ in range(6):
            matrix @ matrix

    costs, computing = {}, []
    for op in OPS:
        call = _call(op, world)
        alone, with_call = [], []
        for _ in range(WARMUP + ROUNDS):
            start = time.perf_counter()
            compute()
            alone.append(time.perf_counter() - start)
            start = time.perf_counter()
            compute()
            call()
            with_call.append(time.perf_counter() - start)
        costs[op] = max(0.0, statistics.mean(with_call[WARMUP:]) - statistics.mean(alone[WARMUP:]))
        computing += alone[WARMUP:]
    return costs, statistics.mean(computing)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(
            "usage: rankwise launch --nproc-per-node N -m rankwise.tools.plan.between OUT.json",
            file=sys.stderr,
        )
        return 2
    dist.init_process_group("gloo")
    try:
        costs, compute_s = call_costs(dist.get_world_size())
        # Why: every rank's cost, so the slowest rank's is the one reported (a step waits for it).
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, costs)
        if dist.get_rank() == 0:
            result = {
                "world_size": dist.get_world_size(),
                "backend": dist.get_backend(),
                "compute_ms": compute_s * 1e3,
                "message_bytes": MESSAGE,
                "call_us": {op: max(rank[op] for rank in gathered) * 1e6 for op in OPS},
            }
            Path(argv[0]).write_text(json.dumps(result, indent=2), encoding="utf-8")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
