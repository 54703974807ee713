"""The ``mp.spawn`` launcher: start N local processes running a Python function.

``fn(local_rank, *args)`` runs in each process with RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT already exported, so ``rankwise.setup()`` inside it joins
the group exactly as under torchrun.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable

import torch.multiprocessing as mp

from rankwise.errors import LaunchError, Stopped
from rankwise.launch.config import LaunchConfig
from rankwise.launch.entry import Entry
from rankwise.launch.failures import RankFailure
from rankwise.launch.network import choose_interface, wait_for_master
from rankwise.launch.ports import free_port, set_worker_environment
from rankwise.process import ProcessEnv


def _entry(local_rank: int, fn: Callable, nprocs: int, nnodes: int, node_rank: int, master_addr: str,
           master_port: int, args: tuple) -> None:
    ProcessEnv.from_spawn(local_rank, nprocs, node_rank=node_rank, nnodes=nnodes, master_addr=master_addr,
                          master_port=master_port).export()
    fn(local_rank, *args)


def _run_entry(local_rank: int, entry: Entry) -> None:
    entry.run()


def launch(config: LaunchConfig, entry: Entry) -> None:
    """Run ``entry``'s ``main`` in ``config.nproc_per_node`` spawned processes (the launcher table's entry)."""
    spawn(_run_entry, config.nproc_per_node, (entry,), nnodes=config.node_range[1], node_rank=config.node_rank,
          master_addr=config.master_addr, master_port=config.master_port, rdzv_timeout_s=config.timeout_s)


def spawn(fn: Callable, nprocs: int, args: tuple = (), *, nnodes: int = 1, node_rank: int = 0,
          master_addr: str = "127.0.0.1", master_port: int | None = None, rdzv_timeout_s: float = 600.0) -> None:
    """Run ``fn(local_rank, *args)`` in ``nprocs`` processes on this node and wait for all of them.

    On a node other than the master's, first wait up to ``rdzv_timeout_s`` for the master's port.

    SIGTERM / SIGINT to this process are forwarded to every worker (which may checkpoint and
    exit, see ``rankwise.train.preemption``) and end in :class:`Stopped`; a failed worker ends in a
    :class:`LaunchError` naming it, its host and its traceback.
    """
    if master_port is None:
        if nnodes > 1:
            raise LaunchError([f"node {node_rank}: a multi-node spawn needs --master-port (all nodes must agree)"])
        master_port = free_port()
    if nnodes > 1:
        note = choose_interface(master_addr, f"node {node_rank}")
        if note:
            print(f"rankwise: {note}", file=sys.stderr, flush=True)
        if node_rank != 0:
            wait_for_master(master_addr, master_port, rdzv_timeout_s, f"node {node_rank}")
    set_worker_environment(nprocs)
    context = mp.start_processes(_entry, args=(fn, nprocs, nnodes, node_rank, master_addr, master_port, args),
                                 nprocs=nprocs, join=False, start_method="spawn")
    received: list[int] = []

    def forward(signum, frame) -> None:
        received.append(signum)
        for process in context.processes:
            if process.is_alive():
                try:
                    os.kill(process.pid, signum)
                except ProcessLookupError:
                    pass  # it exited in between

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not context.join():
            pass
    except mp.ProcessRaisedException as e:
        lines = [line for line in str(e).strip().splitlines() if line.strip()]
        raise LaunchError.from_ranks([RankFailure(node_rank * nprocs + e.error_index, e.error_index, e.error_pid,
                                                  "an exception", lines[-1], str(e), socket.gethostname(),
                                                  time.time())]) from None
    except mp.ProcessExitedException as e:
        if received and e.exit_code == 128 + received[0]:
            raise Stopped(received[0]) from None  # the workers checkpointed and exited as asked
        how = f"signal {e.signal_name}" if e.signal_name else f"exit code {e.exit_code}"
        raise LaunchError.from_ranks([RankFailure(node_rank * nprocs + e.error_index, e.error_index, e.error_pid,
                                                  how, "", "", socket.gethostname(), time.time())]) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise Stopped(received[0])
