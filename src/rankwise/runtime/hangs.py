"""Name the rank(s) a timed-out collective waited for.

When a rank stops responding, its peers wait in their next collective until the
process-group timeout (``launch.timeout_s``) and gloo reports only "Timed out waiting
... for recv" — and the broken connections make a second collective useless for finding
out more.  The rendezvous store still works: each timed-out rank records itself there,
waits a moment for the others to do the same, and the ranks that never do are the ones
that did not arrive.  On a multi-node job each rank also records at start-up which node
and address it runs on, so the message names the node; a rank that cannot reach the
store either says that its node lost the master.
"""

from __future__ import annotations

import datetime
import json
import re
import socket
import time

from rankwise.process import ProcessEnv, restart_count

TIMEOUT_SIGNS = (
    "Timed out waiting",
    "Application timeout caused pair closure",
    "Watchdog caught collective operation timeout",
)
"""How gloo and NCCL report a collective that did not complete in time (nothing else is
diagnosed)."""
PEER_GONE = re.compile(r"Connection (?:closed|reset) by peer \[([^\]]+)\]")
"""How gloo reports a peer whose process died or whose node went down mid-collective (its
address)."""
KEY = "rankwise/timed-out/attempt-{attempt}/{rank}"
"""Per attempt: a restarted worker group must not see the records of the one before."""
WHERE = "rankwise/where/attempt-{attempt}/{rank}"
"""A multi-node rank's node, host name and address (``announce``)."""


def _store(env: ProcessEnv, timeout_s: float):
    from torch.distributed import TCPStore

    assert env.master_port is not None  # a multi-node rank: its launcher set MASTER_PORT
    return TCPStore(
        env.master_addr,
        env.master_port,
        is_master=False,
        timeout=datetime.timedelta(seconds=max(timeout_s, 1.0)),
    )


def _whereabouts(env: ProcessEnv) -> dict:
    from rankwise.launch.network import route_to

    interface = route_to(env.master_addr)
    return {
        "node": env.node_rank,
        "host": socket.gethostname(),
        "address": interface.address if interface else "?",
    }


def _describe(where: dict) -> str:
    return f"node {where['node']} (host {where['host']}, {where['address']})"


def announce(env: ProcessEnv) -> None:
    """Record this rank's node and address for a later diagnosis (multi-node jobs only; best
    effort)."""
    if not env.distributed or env.master_port is None or env.local_world_size == env.world_size:
        return
    try:
        _store(env, 10.0).set(
            WHERE.format(attempt=restart_count(), rank=env.rank), json.dumps(_whereabouts(env))
        )
    except Exception:  # noqa: BLE001 - the diagnosis is a help, never a new failure
        pass


def is_timeout(exc: BaseException) -> bool:
    return any(sign in str(exc) for sign in TIMEOUT_SIGNS)


def missing_ranks(store, env: ProcessEnv, grace_s: float = 5.0) -> list[int]:
    """The ranks that did not also time out within ``grace_s`` (a store round trip per rank)."""
    attempt = restart_count()
    store.set(KEY.format(attempt=attempt, rank=env.rank), "1")
    deadline = time.monotonic() + grace_s
    while True:
        missing = [
            r
            for r in range(env.world_size)
            if not store.check([KEY.format(attempt=attempt, rank=r)])
        ]
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.2)


def explain(exc: BaseException, env: ProcessEnv, timeout_s: float) -> RuntimeError | None:
    """A RuntimeError naming the ranks that never arrived (a collective timed out) or the node whose
    ranks closed their connections (gloo's "Connection closed by peer [ADDRESS]"), or None when
    ``exc`` is neither (or the store cannot tell)."""
    if not env.distributed or env.master_port is None:
        return None
    peer = PEER_GONE.search(str(exc))
    if peer and env.local_world_size != env.world_size:
        return _peer_gone(env, peer.group(1))
    if not is_timeout(exc):
        return None
    what = f"a collective did not complete within launch.timeout_s={timeout_s:g} s"
    try:
        store = _store(env, 5.0)
        missing = missing_ranks(store, env)
    except Exception:  # noqa: BLE001 - the store does not answer either
        if env.local_world_size == env.world_size:
            return None  # one node: the master process is gone, its own error is the cause
        return RuntimeError(
            f"rank {env.rank} on {_describe(_whereabouts(env))}: {what}, and the master's store at "
            f"{env.master_addr}:{env.master_port} does not answer either: this node lost its "
            "connection to the master node (a link down, a firewall), or the master node is gone"
        )
    if not missing:
        return None
    names = ", ".join(_name(store, rank) for rank in missing)
    return RuntimeError(
        f"rank {env.rank}: {what}: {names} never arrived (hung, far slower than the others, or cut "
        f"off from the network); the other ranks were waiting for them"
    )


def _peer_gone(env: ProcessEnv, address: str) -> RuntimeError | None:
    """Name the node at ``address`` from the ranks' announcements, or None when none announced
    it."""
    attempt = restart_count()
    try:
        store = _store(env, 5.0)
        keys = {rank: WHERE.format(attempt=attempt, rank=rank) for rank in range(env.world_size)}
        announced = {
            rank: json.loads(store.get(key)) for rank, key in keys.items() if store.check([key])
        }
        there = [(rank, where) for rank, where in announced.items() if where["address"] == address]
    except Exception:  # noqa: BLE001 - the master's store is gone too (it was on that node): nothing to name
        return None
    if not there:
        return None
    ranks = ", ".join(str(rank) for rank, _ in there)
    return RuntimeError(
        f"rank {env.rank}: {_describe(there[0][1])} closed its connections in the middle of a "
        f"collective (rank(s) {ranks} there): their processes died or that node went down"
    )


def _name(store, rank: int) -> str:
    """``rank 3 on node 1 (host h, 10.0.0.2)`` when the rank announced itself, else ``rank 3``."""
    key = WHERE.format(attempt=restart_count(), rank=rank)
    try:
        if store.check([key]):
            return f"rank {rank} on {_describe(json.loads(store.get(key)))}"
    except Exception:  # noqa: BLE001 - the name is a help
        pass
    return f"rank {rank}"
