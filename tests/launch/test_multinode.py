"""Two real hosts: two Linux network namespaces joined by a veth pair, one `rankwise train` agent in each.

The machine's hostname resolves to a loopback address here, as on many machines: without
an interface choice every rank advertises 127.0.0.1 and gloo's connections are refused.
No interface variable is set by the test: rankwise must pick the veth itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankwise.checkpoint import read_weights
from tests.conftest import HOSTS, MASTER

ROOT = Path(__file__).parents[2]
JOB = ("--data", "sentiment", "--set", "data.limit=300", "--set", "data.max_length=32", "--set", "data.tokenizer=char",
       "--strategy", "ddp", "--max-steps", "6", "--batch-size", "16", "--seed", "5", "--set", "eval_batch_size=64",
       "--no-progress", "--json", "--set", "launch.timeout_s=60")


def _clean_env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR", "LOCAL_RANK", "GLOO_SOCKET_IFNAME",
            "NCCL_SOCKET_IFNAME")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _node(namespace: str, node_rank: int, out: Path, nproc: int, port: int) -> subprocess.Popen:
    command = ["ip", "netns", "exec", namespace, sys.executable, "-m", "rankwise.cli", "train", *JOB,
               "--nnodes", "2", "--node-rank", str(node_rank), "--master-addr", MASTER, "--master-port", str(port),
               "--nproc-per-node", str(nproc), "--out", str(out)]
    return subprocess.Popen(command, env=_clean_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _one_host(out: Path, nproc: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "rankwise.cli", "train", *JOB, "--nproc-per-node", str(nproc),
                           "--out", str(out)], env=_clean_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("nproc", [1, 2])
def test_two_hosts_train_like_one_host_with_the_same_world_size(nproc, two_hosts, tmp_path):
    port = 29617 + nproc
    nodes = [_node(namespace, rank, tmp_path / f"node{rank}", nproc, port) for rank, namespace in enumerate(HOSTS)]
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
    two, one = read_weights(tmp_path / "node0" / "checkpoints"), read_weights(tmp_path / "one-host" / "checkpoints")
    difference = max((two[k] - one[k]).abs().max().item() for k in one)
    print(f"2 hosts x {nproc}: max |two hosts - one host| = {difference:.2e}")
    assert difference < 1e-6
