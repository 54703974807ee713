"""Naming the node a failed collective lost, from what each rank announced in the rendezvous
store."""

import datetime
import json

from torch.distributed import TCPStore

from rankwise.launch.ports import free_port
from rankwise.process import ProcessEnv
from rankwise.runtime import hangs


def test_a_peer_that_closed_its_connections_is_named_by_node():
    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=10))
    where = {
        0: {"node": 0, "host": "a", "address": "10.0.0.1"},
        1: {"node": 0, "host": "a", "address": "10.0.0.1"},
        2: {"node": 1, "host": "b", "address": "10.0.0.2"},
        3: {"node": 1, "host": "b", "address": "10.0.0.2"},
    }
    for rank, place in where.items():
        store.set(hangs.WHERE.format(attempt=0, rank=rank), json.dumps(place))
    env = ProcessEnv(rank=0, world_size=4, local_world_size=2, master_port=port, source="torchrun")
    gloo = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[10.0.0.2]:5867"
    )
    explained = hangs.explain(gloo, env, timeout_s=4)
    assert str(explained) == (
        "rank 0: node 1 (host b, 10.0.0.2) closed its connections in the middle of a collective "
        "(rank(s) 2, 3 there): their processes died or that node went down"
    )
    # no rank announced that address
    unknown = RuntimeError("Connection reset by peer [10.9.9.9]:1")
    assert hangs.explain(unknown, env, timeout_s=4) is None
    one_node = ProcessEnv(
        rank=0, world_size=2, local_world_size=2, master_port=port, source="torchrun"
    )
    # one node: the dead process's own error says it
    assert hangs.explain(gloo, one_node, timeout_s=4) is None
