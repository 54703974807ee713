"""Run a function on N real ranks (spawned processes, gloo) and return each rank's result or traceback."""

from __future__ import annotations

import os
import queue
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch.multiprocessing as mp

from rankwise.launch.ports import free_port


@dataclass
class RankResult:
    rank: int
    value: Any = None
    error: str | None = None


class RanksFailed(AssertionError):
    pass


def _child(rank: int, world_size: int, port: int, fn: Callable, args: tuple, results) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    try:
        results.put(RankResult(rank, value=fn(*args)))
    except BaseException:  # noqa: BLE001 - report everything to the test
        results.put(RankResult(rank, error=traceback.format_exc()))


def run_ranks(fn: Callable, world_size: int, *args, timeout: float = 240.0) -> list[Any]:
    """``fn(*args)`` on ``world_size`` ranks; returns the values in rank order or raises with every traceback.

    A rank that hangs (e.g. waits in a collective its peer never joins) fails the test
    after ``timeout`` seconds and every child is killed: no stray processes.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(r, world_size, port, fn, args, results), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    collected: dict[int, RankResult] = {}
    try:
        while len(collected) < world_size:
            try:
                item = results.get(timeout=timeout)
            except queue.Empty:
                missing = sorted(set(range(world_size)) - set(collected))
                raise RanksFailed(f"rank(s) {missing} produced no result within {timeout:.0f} s") from None
            collected[item.rank] = item
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    errors = [f"--- rank {r} ---\n{res.error}" for r, res in sorted(collected.items()) if res.error]
    if errors:
        raise RanksFailed("\n".join(errors))
    bad_exit = [(p.pid, p.exitcode) for p in procs if p.exitcode not in (0, None)]
    if bad_exit:
        raise RanksFailed(f"ranks finished their work but exited abnormally (pid, exitcode): {bad_exit}")
    return [collected[r].value for r in range(world_size)]
