"""`rankwise comm` across two real hosts (network namespaces joined by a veth pair, see
conftest.two_hosts)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import MASTER
from tests.support.cli import INTERFACE_VARIABLES, ROOT, command_env
from tests.support.cli import command as rankwise_command

pytestmark = pytest.mark.multinode  # two hosts from network namespaces (conftest.two_hosts)


def _node(namespace: str, node_rank: int, port: int, *command: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            namespace,
            *rankwise_command("comm", *command),
            "--nnodes",
            "2",
            "--node-rank",
            str(node_rank),
            "--master-addr",
            MASTER,
            "--master-port",
            str(port),
            "--timeout",
            "30",
        ],
        env=command_env(INTERFACE_VARIABLES),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _both(*nodes: subprocess.Popen) -> list[tuple[int, str, str]]:
    return [(node.wait(timeout=120), *node.communicate()) for node in nodes]


def test_demo_and_bench_across_two_hosts(two_hosts, tmp_path):
    demo = [
        "demo",
        "--nproc-per-node",
        "1",
        "--op",
        "all_reduce",
        "--op",
        "scatter",
        "--op",
        "all_to_all_single",
    ]
    (code0, out0, err0), (code1, out1, err1) = _both(
        _node("rw-node0", 0, 29751, *demo), _node("rw-node1", 1, 29751, *demo)
    )
    assert (code0, code1) == (0, 0), err0 + err1
    assert "2 ranks on gloo (cpu), 2 node(s)" in out0 and "11 of 11 operations passed" in out0
    assert "node 1: this node's ranks took part" in out1

    out = tmp_path / "comm"
    bench = [
        "bench",
        "--nproc-per-node",
        "1",
        "--ops",
        "all_reduce,broadcast",
        "--max-bytes",
        "64K",
        "--iters",
        "3",
        "--no-progress",
        "--out",
        str(out),
    ]
    (code0, out0, err0), (code1, out1, err1) = _both(
        _node("rw-node0", 0, 29761, *bench), _node("rw-node1", 1, 29761, *bench)
    )
    assert (code0, code1) == (0, 0), err0 + err1
    result = json.loads((out / "comm.json").read_text())
    assert result["nnodes"] == 2 and result["world_size"] == 2
    assert all(row["wrong"] == 0 for row in result["results"]) and len(result["results"]) == 2 * 15
    limits = result["ceilings"]  # node 0's own, and the link between the nodes
    assert {
        "tcp_loopback_GBps",
        "memcpy_1thread_GBps",
        "tcp_between_nodes_GBps",
        "tcp_between_nodes_bidirectional_GBps",
    } <= set(limits) and min(limits.values()) > 0
    assert "TCP node 0 <- node 1" in out0 and "measuring TCP between node 0 and node 1" in err1
    print(limits)
