"""The ``mp.spawn`` launcher: start N local processes running a Python function.

``fn(local_rank, *args)`` runs in each process with RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT already exported, so ``rankwise.setup()`` inside it joins
the group exactly as under torchrun.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.multiprocessing as mp

from rankwise.env import ProcessEnv
from rankwise.launch.errors import LaunchError
from rankwise.launch.ports import free_port, set_worker_environment


def _entry(local_rank: int, fn: Callable, nprocs: int, nnodes: int, node_rank: int, master_addr: str,
           master_port: int, args: tuple) -> None:
    ProcessEnv.from_spawn(local_rank, nprocs, node_rank=node_rank, nnodes=nnodes, master_addr=master_addr,
                          master_port=master_port).export()
    fn(local_rank, *args)


def spawn(fn: Callable, nprocs: int, args: tuple = (), *, nnodes: int = 1, node_rank: int = 0,
          master_addr: str = "127.0.0.1", master_port: int | None = None) -> None:
    """Run ``fn(local_rank, *args)`` in ``nprocs`` processes on this node and wait for all of them."""
    if master_port is None:
        if nnodes > 1:
            raise LaunchError([f"node {node_rank}: a multi-node spawn needs --master-port (all nodes must agree)"])
        master_port = free_port()
    set_worker_environment(nprocs)
    try:
        mp.start_processes(_entry, args=(fn, nprocs, nnodes, node_rank, master_addr, master_port, args),
                           nprocs=nprocs, join=True, start_method="spawn")
    except mp.ProcessRaisedException as e:
        local = e.error_index
        rank = node_rank * nprocs + local
        last_line = [line for line in str(e).strip().splitlines() if line.strip()][-1]
        raise LaunchError([f"rank {rank} (local rank {local}, pid {e.error_pid}): {last_line}\n{e}"]) from None
    except mp.ProcessExitedException as e:
        local = e.error_index
        rank = node_rank * nprocs + local
        how = f"signal {e.signal_name}" if e.signal_name else f"exit code {e.exit_code}"
        raise LaunchError([f"rank {rank} (local rank {local}, pid {e.error_pid}) died with {how}"]) from None
