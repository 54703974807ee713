"""The ``mp.spawn`` launcher: start N local processes running a Python function.

``fn(local_rank, *args)`` runs in each process with RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT already exported, so ``rankwise.setup()`` inside it joins
the group exactly as under torchrun.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import time
from collections.abc import Callable

import torch.multiprocessing as mp

from rankwise.errors import LaunchError, Stopped
from rankwise.launch.config import LaunchConfig
from rankwise.launch.entry import Entry
from rankwise.launch.failures import RankFailure
from rankwise.launch.network import choose_interface, wait_for_master
from rankwise.launch.ports import free_port, set_worker_environment
from rankwise.logs import get_logger
from rankwise.process import ProcessEnv

log = get_logger(__name__)

PEER_GRACE_S = 5.0
"""How long the other ranks of a node get to exit by themselves after one failed, before they are
terminated."""


def _entry(
    local_rank: int,
    fn: Callable,
    nprocs: int,
    nnodes: int,
    node_rank: int,
    master_addr: str,
    master_port: int,
    args: tuple,
) -> None:
    ProcessEnv.from_spawn(
        local_rank,
        nprocs,
        node_rank=node_rank,
        nnodes=nnodes,
        master_addr=master_addr,
        master_port=master_port,
    ).export()
    fn(local_rank, *args)


def _run_entry(local_rank: int, entry: Entry) -> None:
    entry.run()


def launch(config: LaunchConfig, entry: Entry) -> None:
    """Run ``entry``'s ``main`` in ``config.nproc_per_node`` spawned processes (the launcher table's
    entry)."""
    spawn(
        _run_entry,
        config.nproc_per_node,
        (entry,),
        nnodes=config.node_range[1],
        node_rank=config.node_rank,
        master_addr=config.master_addr,
        master_port=config.master_port,
        rdzv_timeout_s=config.timeout_s,
    )


def spawn(
    fn: Callable,
    nprocs: int,
    args: tuple = (),
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    rdzv_timeout_s: float = 600.0,
) -> None:
    """Run ``fn(local_rank, *args)`` in ``nprocs`` processes on this node and wait for all of them.

    On a node other than the master's, first wait up to ``rdzv_timeout_s`` for the master's port.

    SIGTERM / SIGINT to this process are forwarded to every worker (which may checkpoint and
    exit, see ``rankwise.train.preemption``) and end in :class:`Stopped`; a failed worker ends in a
    :class:`LaunchError` naming it, its host and its traceback.
    """
    if master_port is None:
        if nnodes > 1:
            raise LaunchError(
                [f"node {node_rank}: a multi-node spawn needs --master-port (all nodes must agree)"]
            )
        master_port = free_port()
    if nnodes > 1:
        note = choose_interface(master_addr, f"node {node_rank}")
        if note:
            log.info(f"rankwise: {note}", stderr=True, every_rank=True)  # each node its own
        if node_rank != 0:
            wait_for_master(master_addr, master_port, rdzv_timeout_s, f"node {node_rank}")
    set_worker_environment(nprocs)
    context = mp.start_processes(
        _entry,
        args=(fn, nprocs, nnodes, node_rank, master_addr, master_port, args),
        nprocs=nprocs,
        join=False,
        start_method="spawn",
    )
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
        # A failed rank's peers usually fail on their own within moments (their connection to it
        # closed): the grace period lets them write their errors, so the summary can tell the cause
        # from its victims.
        while not context.join(grace_period=PEER_GRACE_S):
            pass
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:
        failures = _failures(context, e, node_rank, nprocs)
        # The workers checkpointed and exited as asked, were ended by the signal, or lost a peer to
        # it: stopped.  An error of its own while stopping (a full disk at the stop's checkpoint) is
        # a failure, not a stop.
        if received and not [
            f
            for f in failures
            if f.how == "an exception" and not f.victim and "KeyboardInterrupt" not in f.error
        ]:
            raise Stopped(received[0]) from None
        raise LaunchError.from_ranks(failures) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise Stopped(received[0])


def _failures(
    context,
    first: mp.ProcessExitedException | mp.ProcessRaisedException,
    node_rank: int,
    nprocs: int,
) -> list[RankFailure]:
    """Every failed rank of this node: the one ``join`` reported and each other that wrote an error
    (the first to be reported is not always the cause: a peer that lost its connection to the cause
    may exit sooner)."""
    host = socket.gethostname()
    failures = []
    for index, process in enumerate(context.processes):
        error_file = context.error_files[index]
        if os.path.exists(error_file) and os.path.getsize(error_file):
            with open(error_file, "rb") as handle:
                trace = pickle.load(handle)
            lines = [line for line in trace.strip().splitlines() if line.strip()]
            failures.append(
                RankFailure(
                    node_rank * nprocs + index,
                    index,
                    process.pid,
                    "an exception",
                    lines[-1] if lines else "",
                    trace,
                    host,
                    os.path.getmtime(error_file),
                )
            )
        elif index == first.error_index:
            exit_code = getattr(first, "exit_code", process.exitcode)
            name = getattr(first, "signal_name", None)
            how = f"signal {name}" if name else f"exit code {exit_code}"
            failures.append(
                RankFailure(
                    node_rank * nprocs + index, index, process.pid, how, "", "", host, time.time()
                )
            )
    return failures
