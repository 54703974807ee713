"""`rankwise doctor` alone, and across two real hosts (network namespaces, see
conftest.two_hosts)."""

from __future__ import annotations

import re
import subprocess

from rankwise import cli
from rankwise.launch.ports import free_port
from tests.conftest import MASTER
from tests.support.cli import INTERFACE_VARIABLES, ROOT, command, command_env


def test_doctor_alone_reports_this_machine_and_passes(capsys):
    assert cli.main(["doctor", "--master-port", str(free_port())]) == 0
    out = capsys.readouterr().out
    for name in ("versions", "devices", "backends", "cores", "interfaces", "hostname", "port"):
        assert f"  {name}" in out, name
    assert "torch 2." in out and "gloo yes" in out and "node 0: every check passed" in out


def test_doctor_alone_fails_on_a_port_in_use(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        assert cli.main(["doctor", "--master-port", str(taken.getsockname()[1])]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] node 0  port" in out and "fix: choose another --master-port" in out


def _doctor(namespace: str, node_rank: int, port: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            namespace,
            *command("doctor"),
            "--nnodes",
            "2",
            "--node-rank",
            str(node_rank),
            "--master-addr",
            MASTER,
            "--master-port",
            str(port),
            "--nproc-per-node",
            "1",
            "--timeout",
            "8",
            *extra,
        ],
        env=command_env(INTERFACE_VARIABLES),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _both(*nodes: subprocess.Popen) -> list[tuple[int, str]]:
    return [(node.wait(timeout=120), node.communicate()[0]) for node in nodes]


def test_doctor_passes_across_two_hosts_and_measures_all_reduce(two_hosts):
    (code0, out0), (code1, out1) = _both(
        _doctor("rw-node0", 0, 29711), _doctor("rw-node1", 1, 29711)
    )
    assert (code0, code1) == (0, 0), out0 + out1
    assert "node 1 reaches the master over rw-veth1 (10.213.8.2)" in out1
    assert "node 1 reached 10.213.8.1:29711" in out1 and "versions agree" in out0
    assert "2 ranks on gloo, 16 MiB fp32" in out0 and "busbw" in out0
    print(next(line for line in out0.splitlines() if "all_reduce" in line))


def test_doctor_names_the_node_that_cannot_reach_the_master(two_hosts):
    (code0, out0), (code1, out1) = _both(
        _doctor("rw-node0", 0, 29721), _doctor("rw-node1", 1, 29791)
    )
    assert code0 == 1 and code1 == 1
    assert (
        f"node 1 cannot reach {MASTER}:29791" in out1
        and "fix: firewall, wrong --master-addr" in out1
    )
    assert "not every node reported within 8" in out0


def test_doctor_fails_when_a_link_is_down(two_hosts):
    subprocess.run(["ip", "-n", "rw-node1", "link", "set", "rw-veth1", "down"], check=True)
    try:
        (code0, out0), (code1, out1) = _both(
            _doctor("rw-node0", 0, 29731), _doctor("rw-node1", 1, 29731)
        )
    finally:
        subprocess.run(["ip", "-n", "rw-node1", "link", "set", "rw-veth1", "up"], check=True)
    assert code0 == 1 and code1 == 1
    assert re.search(rf"\[FAIL\] node 1  interface +node 1 has no route to {MASTER}", out1), out1
    assert f"node 1 cannot reach {MASTER}:29731" in out1
    assert "not every node reported" in out0
