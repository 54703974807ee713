"""torch elastic: the agent's store carries no per-restart key space, and a shared rendezvous store
caches rank 0's address from the first round."""

import datetime
import inspect

import torch.distributed as torch_dist
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

from rankwise.compat.torch_elastic import publish_master_address_every_round, store_for_this_attempt
from rankwise.launch.ports import free_port

TIMEOUT = datetime.timedelta(seconds=10)


def _agent_store(port: int):
    """The store torchrun's agent hosts (its server runs in a thread of this process)."""
    return torch_dist.TCPStore(
        "127.0.0.1", port, world_size=2, is_master=True, timeout=TIMEOUT, wait_for_workers=False
    )


def test_torch_connects_a_restarted_worker_to_the_agent_store_without_an_attempt_prefix(
    monkeypatch,
):
    """When this fails, torch isolates restarts itself: drop store_for_this_attempt."""
    from torch.distributed.rendezvous import _create_c10d_store

    port = free_port()
    agent = _agent_store(port)
    agent.set("MASTER_ADDR", "a dead peer's address")  # what attempt 0 published
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    restarted = _create_c10d_store("127.0.0.1", port, 1, 2, TIMEOUT)
    assert restarted.get("MASTER_ADDR") == b"a dead peer's address"

    ours = store_for_this_attempt("127.0.0.1", port, 2, attempt=1, timeout=TIMEOUT)
    assert isinstance(ours, torch_dist.PrefixStore) and not ours.check(["MASTER_ADDR"])
    # torch's own
    assert store_for_this_attempt("127.0.0.1", port, 2, attempt=0, timeout=TIMEOUT) is None


def test_a_dynamic_rendezvous_still_shares_its_store_and_builds_the_address_once(monkeypatch):
    """When this fails, the knob is gone or the address is rebuilt every round: drop the
    workaround."""
    # (recorded: the variable is restored after)
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "")
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    assert DynamicRendezvousHandler.use_agent_store.fget(None)  # shared by default
    assert "self._bootstrap_store_info is None" in inspect.getsource(
        DynamicRendezvousHandler.next_rendezvous
    )
    publish_master_address_every_round()
    assert not DynamicRendezvousHandler.use_agent_store.fget(None)  # the opt-out torch reads


def test_a_value_the_user_set_wins(monkeypatch):
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0")
    publish_master_address_every_round()
    assert DynamicRendezvousHandler.use_agent_store.fget(None)
