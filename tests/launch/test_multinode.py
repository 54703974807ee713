"""Two real hosts: two Linux network namespaces joined by a veth pair, one `rankwise train` agent in
each.

The machine's hostname resolves to a loopback address here, as on many machines: without
an interface choice every rank advertises 127.0.0.1 and gloo's connections are refused.
No interface variable is set by the test: rankwise must pick the veth itself.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from rankwise.checkpoint import read_weights
from rankwise.measure.tolerance import max_param_diff
from tests.conftest import HOSTS, MASTER
from tests.support.cli import (
    LAUNCH_VARIABLES,
    ROOT,
    command,
    command_env,
    json_summary,
    rankwise,
    tiny_text,
)

pytestmark = pytest.mark.multinode  # two hosts from network namespaces (conftest.two_hosts)

JOB = (
    *tiny_text(),
    "--strategy",
    "ddp",
    "--max-steps",
    "6",
    "--batch-size",
    "16",
    "--seed",
    "5",
    "--no-progress",
    "--json",
    "--set",
    "launch.timeout_s=60",
)


def _clean_env() -> dict[str, str]:
    return command_env(LAUNCH_VARIABLES)


def _in(namespace: str, *args: str) -> subprocess.Popen:
    """``rankwise ARGS`` on the host ``namespace``."""
    return subprocess.Popen(
        ["ip", "netns", "exec", namespace, *command(*args)],
        env=_clean_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _node(
    namespace: str, node_rank: int, out: Path, nproc: int, port: int, *extra: str
) -> subprocess.Popen:
    return _in(
        namespace,
        "train",
        *JOB,
        "--nnodes",
        "2",
        "--node-rank",
        str(node_rank),
        "--master-addr",
        MASTER,
        "--master-port",
        str(port),
        "--nproc-per-node",
        str(nproc),
        "--out",
        str(out),
        *extra,
    )


def _link(namespace: str, state: str) -> None:
    device = f"rw-veth{list(HOSTS).index(namespace)}"
    subprocess.run(["ip", "-n", namespace, "link", "set", device, state], check=True, timeout=30)


def _one_host(out: Path, nproc: int) -> dict:
    proc = rankwise(
        "train",
        *JOB,
        "--nproc-per-node",
        str(nproc),
        "--out",
        str(out),
        env=_clean_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json_summary(proc)


# one rank per node: the c10d test below, doctor's and comm's two-host tests
@pytest.mark.parametrize("nproc", [2])
def test_two_hosts_train_like_one_host_with_the_same_world_size(nproc, two_hosts, tmp_path):
    port = 29617 + nproc
    nodes = [
        _node(namespace, rank, tmp_path / f"node{rank}", nproc, port)
        for rank, namespace in enumerate(HOSTS)
    ]
    outputs = [node.communicate(timeout=300) for node in nodes]
    for node, (_, stderr) in zip(nodes, outputs):
        assert node.returncode == 0, stderr[-3000:]
    head_stderr = outputs[0][1]
    assert f"node 0: ranks talk over rw-veth0 ({MASTER})" in head_stderr  # chosen and said
    assert "resolves to a loopback address" in head_stderr
    summary = json.loads(outputs[0][0].strip().splitlines()[-1])
    assert (summary["world_size"], summary["eval_samples"]) == (2 * nproc, 300)
    single_host = _one_host(tmp_path / "one-host", 2 * nproc)
    assert single_host["world_size"] == 2 * nproc
    two, one = (
        read_weights(tmp_path / "node0" / "checkpoints"),
        read_weights(tmp_path / "one-host" / "checkpoints"),
    )
    difference = max_param_diff(two, one)
    print(f"2 hosts x {nproc}: max |two hosts - one host| = {difference:.2e}")
    assert difference < 1e-6


def _max_difference(a: Path, b: Path) -> float:
    one, two = read_weights(a / "checkpoints"), read_weights(b / "checkpoints")
    return max_param_diff(one, two)


def test_c10d_rendezvous_with_an_elastic_node_range_trains_like_one_host(two_hosts, tmp_path):
    """torch names the c10d store's host by hostname, which resolves to loopback here: rankwise
    tells node 0 it hosts the store and gives the workers its address instead of 'localhost'."""
    rdzv = (
        "--nnodes",
        "1:2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{MASTER}:29631",
        "--rdzv-id",
        "job-1",
    )
    nodes = [
        _in(
            namespace,
            "train",
            *JOB,
            *rdzv,
            "--nproc-per-node",
            "1",
            "--out",
            str(tmp_path / f"node{i}"),
        )
        for i, namespace in enumerate(HOSTS)
    ]
    outputs = [node.communicate(timeout=300) for node in nodes]
    for node, (_, stderr) in zip(nodes, outputs):
        assert node.returncode == 0, stderr[-3000:]
    last_lines = [out.strip().splitlines()[-1] for out, _ in outputs]
    # whichever node holds rank 0
    head = json.loads(next(line for line in last_lines if line.startswith("{")))
    assert (head["world_size"], head["eval_samples"]) == (2, 300)
    _one_host(tmp_path / "one-host", 2)
    trained = next(
        tmp_path / f"node{i}" for i in range(2) if (tmp_path / f"node{i}" / "checkpoints").exists()
    )
    assert _max_difference(trained, tmp_path / "one-host") < 1e-6


def test_launch_with_c10d_rendezvous_across_two_hosts(two_hosts, tmp_path):
    rdzv = (
        "--nnodes",
        "1:2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{MASTER}:29632",
        "--rdzv-id",
        "job-2",
        "--rdzv-conf",
        "join_timeout=60",
    )
    nodes = [
        _in(
            namespace,
            "launch",
            *rdzv,
            "--nproc-per-node",
            "1",
            str(ROOT / "tests/support/launch/rank_probe.py"),
            str(tmp_path),
        )
        for namespace in HOSTS
    ]
    for node in nodes:
        _, stderr = node.communicate(timeout=180)
        assert node.returncode == 0, stderr[-3000:]
    seen = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
    assert [s["runtime"] for s in seen] == [[0, 0, 2], [1, 0, 2]]
    assert {s["MASTER_ADDR"] for s in seen} == {MASTER}  # node 0's address, not its hostname


@pytest.mark.parametrize("link", ["up", "down"])
def test_a_node_that_cannot_reach_the_master_fails_naming_itself_and_the_address(
    link, two_hosts, tmp_path
):
    _link("rw-node1", link)
    try:
        started = time.monotonic()
        node = _node("rw-node1", 1, tmp_path / "node1", 1, 29641, "--set", "launch.timeout_s=4")
        _, stderr = node.communicate(timeout=120)
        elapsed = time.monotonic() - started
    finally:
        _link("rw-node1", "up")
    assert node.returncode == 1, stderr[-3000:]
    host = socket.gethostname()
    where = f"node 1 ({host}, {HOSTS['rw-node1']})" if link == "up" else f"node 1 ({host})"
    cause = "connection refused" if link == "up" else "no route"
    assert f"{where} cannot reach the master {MASTER}:29641 within 4 s: {cause}" in stderr, stderr[
        -3000:
    ]
    assert elapsed < 60  # start-up + the 4 s rendezvous timeout, not torchrun's 600 s
    assert not (tmp_path / "node1" / "checkpoints").exists()


def test_a_link_going_down_mid_training_ends_the_job_naming_the_unreachable_node(
    two_hosts, tmp_path
):
    long_job = (
        "--max-steps",
        "100000",
        "--set",
        "data.limit=2000",
        "--set",
        "log_every=1",
        "--set",
        "launch.timeout_s=8",
    )
    nodes = [
        _node(namespace, rank, tmp_path / f"node{rank}", 1, 29651, *long_job)
        for rank, namespace in enumerate(HOSTS)
    ]
    metrics = tmp_path / "node0" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 180
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            assert time.monotonic() < deadline and all(n.poll() is None for n in nodes), (
                "training never started"
            )
            time.sleep(0.5)
        _link("rw-node1", "down")
        cut = time.monotonic()
        outputs = [node.communicate(timeout=120) for node in nodes]
        ended = time.monotonic() - cut
    finally:
        _link("rw-node1", "up")
        for node in nodes:
            node.kill()
    print(f"both nodes ended {ended:.1f} s after the link went down (launch.timeout_s=8)")
    assert [node.returncode for node in nodes] == [1, 1]
    head, cut_off = (stderr for _, stderr in outputs)
    assert (
        f"rank 1 on node 1 (host {socket.gethostname()}, {HOSTS['rw-node1']}) never arrived" in head
    ), head[-3000:]
    assert "lost its connection to the master node" in cut_off, cut_off[-3000:]
    assert ended < 8 * 4  # the timeout, the diagnosis's few seconds and shutdown; never a hang


def _kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL an agent and its workers at once, as a machine that loses power."""
    import psutil

    agent = psutil.Process(process.pid)
    for victim in [*agent.children(recursive=True), agent]:
        with contextlib.suppress(psutil.NoSuchProcess):
            victim.kill()


def _written_by(checkpoints: Path) -> int | None:
    """The world size that wrote the latest checkpoint (None before the first)."""
    from rankwise.checkpoint import manifest_meta

    try:
        return manifest_meta(checkpoints / "latest").get("world_size")
    except Exception:  # noqa: BLE001 - not there yet, or being replaced
        return None


def _wait_for(condition, what: str, nodes, timeout: float = 180) -> float:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        assert nodes[0].poll() is None, (
            f"node 0 ended while waiting for {what}: {nodes[0].communicate()[1][-3000:]}"
        )
        time.sleep(0.2)
    return time.monotonic()


def test_an_elastic_job_shrinks_when_a_node_dies_and_grows_back_when_it_returns(
    two_hosts, tmp_path
):
    """c10d, --nnodes 1:2, one run directory both hosts see (a shared filesystem).  Node 1's agent
    and worker are killed after a checkpoint of both: node 0's agent restarts its worker alone, at
    world size 1, from the latest checkpoint.  Node 1, started again with the same command, joins at
    the next restart: both continue at world size 2 from the checkpoint node 0's worker wrote when
    its agent stopped it.  The run completes and evaluates the whole test split once; each resume's
    continuity record says no sample was skipped or repeated."""
    from rankwise.data.prepare import PreparedData

    out = tmp_path / "run"
    args = (
        "train",
        *JOB,
        "--max-steps",
        "120",
        "--set",
        "data.limit=2000",
        "--set",
        "save_every=10",
        "--set",
        "log_every=10",
        "--nnodes",
        "1:2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{MASTER}:29661",
        "--rdzv-id",
        "job-elastic",
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "2",
        "--set",
        "launch.rdzv_last_call_s=6",
        "--set",
        "model.dropout=0",
        "--out",
        str(out),
    )
    started = time.monotonic()
    nodes = [_in("rw-node0", *args)]
    try:
        # Node 1 starts once node 0 has prepared the run directory (both write the same files),
        # within the rendezvous's last call, so both nodes train from the first step.
        _wait_for(lambda: (out / "config.json").exists(), "node 0's prepared data", nodes)
        nodes.append(_in("rw-node1", *args))
        first = _wait_for(
            lambda: _written_by(out / "checkpoints") == 2, "a checkpoint of both nodes", nodes
        )
        record = out / "continuity.json"
        # a slow start may have grown 1 -> 2 already: wait for the shrink's record
        record.unlink(missing_ok=True)
        _kill_tree(nodes[1])
        killed = time.monotonic()
        shrunk = _wait_for(lambda: record.exists(), "node 0 to continue alone", nodes)
        alone = json.loads(record.read_text())
        record.unlink()
        nodes[1] = _in("rw-node1", *args)  # the node comes back, with the same command
        grown = _wait_for(lambda: record.exists(), "the group to grow back", nodes)
        outputs = [node.communicate(timeout=240) for node in nodes]
        finished = time.monotonic()
    finally:
        for node in nodes:
            if node.poll() is None:
                _kill_tree(node)
    for node, (_, stderr) in zip(nodes, outputs):
        assert node.returncode == 0, stderr[-3000:]
    again = json.loads(record.read_text())
    print(
        f"checkpoint of both nodes {first - started:.1f} s; node 1 killed {killed - started:.1f} "
        f"s; node 0 continued alone from step {alone['step']} at {shrunk - started:.1f} s; node 1 "
        f"back, both from step {again['step']} at {grown - started:.1f} s; finished "
        f"{finished - started:.1f} s"
    )
    assert (alone["written"]["world_size"], alone["resumed"]["world_size"]) == (2, 1) and alone[
        "continuous"
    ], alone
    assert (again["written"]["world_size"], again["resumed"]["world_size"]) == (1, 2) and again[
        "continuous"
    ], again
    assert again["step"] > alone["step"]
    summary = json.loads((out / "result.json").read_text())
    test_split = PreparedData.load(out / "data").size("test")
    indices = [
        json.loads(line)["index"] for line in (out / "predictions.jsonl").read_text().splitlines()
    ]
    assert (summary["steps"], summary["world_size"], summary["eval_samples"]) == (
        120,
        2,
        test_split,
    )
    assert sorted(indices) == list(range(test_split))  # every test sample evaluated exactly once
