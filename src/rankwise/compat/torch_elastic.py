"""torch elastic (torchrun): a store kept across restarts, and an address cached from a rendezvous's
first round."""

from __future__ import annotations

import datetime
import os

import torch.distributed as torch_dist

from rankwise.compat.versions import Workaround

STORE_PER_RESTART = Workaround(
    name="rankwise.compat.torch_elastic.store_for_this_attempt",
    library="torch",
    upstream="https://github.com/pytorch/pytorch/issues/135712",
    seen_on=("2.13",),
)
UNSHARED_RENDEZVOUS_STORE = Workaround(
    name="rankwise.compat.torch_elastic.publish_master_address_every_round",
    library="torch",
    upstream="https://github.com/pytorch/pytorch/issues/135712 (related: the agent's shared "
    "store; the cached address itself has no issue of its own)",
    seen_on=("2.13",),
)


def store_for_this_attempt(
    host: str, port: int, world_size: int, attempt: int, timeout: datetime.timedelta
) -> torch_dist.Store | None:
    """A key space of its own on torchrun's agent store for restart ``attempt`` (``None`` where
    torch's own store does: a first attempt, no agent store, or a torch without the bug).

    torchrun's static rendezvous keeps one store across restarts of the worker group, and torch's
    ``_create_c10d_store`` connects to it without a per-attempt prefix: a restarted rank could read
    the address a dead peer published (gloo: "Connection refused")."""
    if (
        not attempt
        or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        or not STORE_PER_RESTART.applies()
    ):
        return None
    return torch_dist.PrefixStore(
        f"rankwise/attempt-{attempt}/",
        torch_dist.TCPStore(host, port, world_size=world_size, is_master=False, timeout=timeout),
    )


def publish_master_address_every_round() -> None:
    """Make a dynamic rendezvous publish rank 0's address every round
    (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``).

    With the agent's store shared (torch's default since 2.4), the c10d handler builds the master
    address once, on its first round: a node joining a later round waited for a key nobody writes
    (seen: node 1 rejoining an elastic job waited 60 s for .../MASTER_ADDR while node 0 waited for
    its role_info).  A value the user set wins."""
    if UNSHARED_RENDEZVOUS_STORE.applies():
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
