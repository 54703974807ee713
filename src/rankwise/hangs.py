"""Name the rank(s) a timed-out collective waited for.

When a rank stops responding, its peers wait in their next collective until the
process-group timeout (``launch.timeout_s``) and gloo reports only "Timed out waiting
... for recv" — and the broken connections make a second collective useless for finding
out more.  The rendezvous store still works: each timed-out rank records itself there,
waits a moment for the others to do the same, and the ranks that never do are the ones
that did not arrive.
"""

from __future__ import annotations

import datetime
import time

from rankwise.env import ProcessEnv, restart_count

TIMEOUT_SIGNS = ("Timed out waiting", "Application timeout caused pair closure",
                 "Watchdog caught collective operation timeout")
"""How gloo and NCCL report a collective that did not complete in time (nothing else is diagnosed)."""
KEY = "rankwise/timed-out/attempt-{attempt}/{rank}"
"""Per attempt: a restarted worker group must not see the records of the one before."""


def is_timeout(exc: BaseException) -> bool:
    return any(sign in str(exc) for sign in TIMEOUT_SIGNS)


def missing_ranks(env: ProcessEnv, grace_s: float = 5.0) -> list[int]:
    """The ranks that did not also time out within ``grace_s`` (a store round trip per rank)."""
    from torch.distributed import TCPStore

    store = TCPStore(env.master_addr, env.master_port, is_master=False,
                     timeout=datetime.timedelta(seconds=max(grace_s, 1.0)))
    attempt = restart_count()
    store.set(KEY.format(attempt=attempt, rank=env.rank), "1")
    deadline = time.monotonic() + grace_s
    while True:
        missing = [r for r in range(env.world_size) if not store.check([KEY.format(attempt=attempt, rank=r)])]
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.2)


def explain(exc: BaseException, env: ProcessEnv, timeout_s: float) -> RuntimeError | None:
    """A RuntimeError naming the ranks that never arrived, or None when ``exc`` is no collective timeout
    (or the store cannot tell)."""
    if not env.distributed or env.master_port is None or not is_timeout(exc):
        return None
    try:
        missing = missing_ranks(env)
    except Exception:  # noqa: BLE001 - the store is gone too: keep the original error
        return None
    if not missing:
        return None
    names = ", ".join(str(r) for r in missing)
    return RuntimeError(f"rank {env.rank}: a collective did not complete within launch.timeout_s={timeout_s:g} s: "
                        f"rank(s) {names} never arrived (hung, or far slower than the others); "
                        f"the other ranks were waiting for them")
