"""Run a function on N real ranks (spawned processes, gloo) and return each rank's result or
traceback.

Starting a rank costs seconds (importing torch, transformers, DeepSpeed), far more than
the few training steps a test runs, so ranks are kept in a pool per world size and
reused: every call gets a fresh port and a fresh copy of the rank's environment, joins
a new process group and must leave it destroyed (rankwise's teardown is checked on
every call).  A failed or hung call discards its pool, so the next call starts clean.
``fresh=True`` starts and stops dedicated processes instead, for tests about process
exit itself.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.multiprocessing as mp

from rankwise.launch.ports import free_port

ERROR_GRACE_S = 20.0
"""After one rank fails, how long its peers get to report before the call is abandoned
(a peer often waits in a collective the failed rank will never join)."""


@dataclass
class RankResult:
    rank: int
    call: int
    value: Any = None
    error: str | None = None


class RanksFailed(AssertionError):
    pass


def _rank_env(rank: int, world_size: int) -> dict[str, str]:
    return dict(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        OMP_NUM_THREADS="1",
    )


def _call(rank: int, call: int, fn: Callable, args: tuple) -> RankResult:
    import torch.distributed as torch_dist

    try:
        value = fn(*args)
    except BaseException:  # noqa: BLE001 - report everything to the test
        return RankResult(rank, call, error=traceback.format_exc())
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
        return RankResult(
            rank,
            call,
            error="the call returned with its process group still initialised (teardown did not "
            "run)",
        )
    return RankResult(rank, call, value=value)


def _serve(rank: int, world_size: int, tasks, results) -> None:
    """A pooled rank: run calls until told to stop, each in a clean copy of the start
    environment."""
    os.environ.update(_rank_env(rank, world_size))
    import torch

    torch.set_num_threads(1)
    base_env = dict(os.environ)
    while (task := tasks.get()) is not None:
        call, port, fn, args = task
        os.environ.clear()
        os.environ.update(base_env, MASTER_PORT=str(port))
        results.put(_call(rank, call, fn, args))


def _once(rank: int, world_size: int, port: int, fn: Callable, args: tuple, results) -> None:
    os.environ.update(_rank_env(rank, world_size), MASTER_PORT=str(port))
    import torch

    torch.set_num_threads(1)
    results.put(_call(rank, 0, fn, args))


class RankPool:
    """``world_size`` long-lived rank processes that run one call at a time."""

    _calls = itertools.count(1)

    def __init__(self, world_size: int):
        ctx = mp.get_context("spawn")
        self.world_size = world_size
        self.tasks = [ctx.Queue() for _ in range(world_size)]
        self.results = ctx.Queue()
        self.procs = [
            ctx.Process(
                target=_serve, args=(r, world_size, self.tasks[r], self.results), daemon=True
            )
            for r in range(world_size)
        ]
        for p in self.procs:
            p.start()

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def run(self, fn: Callable, args: tuple, timeout: float) -> dict[int, RankResult]:
        call, port = next(self._calls), free_port()
        for tasks in self.tasks:
            tasks.put((call, port, fn, args))
        return _collect(self.results, self.world_size, timeout, call, self.procs)

    def close(self) -> None:
        for tasks in self.tasks:
            with contextlib.suppress(Exception):
                tasks.put(None)
        _stop(self.procs)


def _collect(results, world_size: int, timeout: float, call: int, procs) -> dict[int, RankResult]:
    collected: dict[int, RankResult] = {}
    deadline = time.monotonic() + timeout
    while len(collected) < world_size:
        if any(r.error for r in collected.values()):
            deadline = min(deadline, time.monotonic() + ERROR_GRACE_S)
        remaining = deadline - time.monotonic()
        # A rank that died without reporting (segfault, abort) will never report.
        dead = [r for r, p in enumerate(procs) if r not in collected and not p.is_alive()]
        try:
            item = results.get(timeout=max(0.1, min(remaining, 1.0)))
        except queue.Empty:
            if remaining <= 0 or dead:
                break
            continue
        if item.call == call:
            collected[item.rank] = item
    missing = sorted(set(range(world_size)) - set(collected))
    for rank in missing:
        process = procs[rank]
        why = (
            f"died with exit code {process.exitcode}"
            if not process.is_alive()
            else f"produced no result within {timeout:.0f} s"
            if not any(r.error for r in collected.values())
            else f"was still waiting {ERROR_GRACE_S:.0f} s after a peer failed"
        )
        collected[rank] = RankResult(rank, call, error=f"rank {rank} {why}")
    return collected


def _stop(procs) -> None:
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()


_pools: dict[int, RankPool] = {}


@atexit.register
def close_pools() -> None:
    while _pools:
        _pools.popitem()[1].close()


def _raise_errors(collected: dict[int, RankResult]) -> None:
    errors = [f"--- rank {r} ---\n{res.error}" for r, res in sorted(collected.items()) if res.error]
    if errors:
        raise RanksFailed("\n".join(errors))


def run_ranks(
    fn: Callable, world_size: int, *args, timeout: float = 240.0, fresh: bool = False
) -> list[Any]:
    """``fn(*args)`` on ``world_size`` ranks; returns the values in rank order or raises with every
    traceback.

    ``fn`` must be importable (a module-level function).  A rank that hangs (e.g. waits
    in a collective its peer never joins) fails the test after ``timeout`` seconds, or
    ``ERROR_GRACE_S`` after a peer failed, and its processes are killed.
    """
    if fresh:
        return _run_fresh(fn, world_size, args, timeout)
    pool = _pools.get(world_size)
    if pool is None or not pool.alive():
        pool = _pools[world_size] = RankPool(world_size)
    collected = pool.run(fn, args, timeout)
    if any(r.error for r in collected.values()):
        # A failed call may leave a rank inside a collective or with half-torn-down state.
        del _pools[world_size]
        for p in pool.procs:
            p.kill()
        _stop(pool.procs)
        _raise_errors(collected)
    return [collected[r].value for r in range(world_size)]


def _run_fresh(fn: Callable, world_size: int, args: tuple, timeout: float) -> list[Any]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_once, args=(r, world_size, port, fn, args, results), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    try:
        collected = _collect(results, world_size, timeout, 0, procs)
    finally:
        for p in procs:
            p.join(timeout=10)
        _stop(procs)
    _raise_errors(collected)
    bad_exit = [(p.pid, p.exitcode) for p in procs if p.exitcode != 0]
    if bad_exit:
        raise RanksFailed(
            f"ranks finished their work but exited abnormally (pid, exitcode): {bad_exit}"
        )
    return [collected[r].value for r in range(world_size)]
