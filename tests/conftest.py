import os
import shutil
import subprocess

import pytest
import torch.distributed as torch_dist

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
              "RANKWISE_STRATEGY", "RANKWISE_PRECISION", "RANKWISE_OPTIONS")  # what `rankwise launch` sets


@pytest.fixture(autouse=True)
def clean_distributed_state():
    """Restore environment variables and destroy any process group a test left behind."""
    saved = {k: os.environ.get(k) for k in (*_DIST_VARS, "OMP_NUM_THREADS")}
    yield
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


HOSTS = {"rw-node0": "10.213.8.1", "rw-node1": "10.213.8.2"}
"""Two network namespaces joined by a veth pair: two hosts for multi-node tests."""
MASTER = HOSTS["rw-node0"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _remove_hosts() -> None:
    for namespace in HOSTS:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


@pytest.fixture(scope="session")
def two_hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("two-host tests need root and iproute2 to create network namespaces")
    _remove_hosts()
    try:
        for namespace in HOSTS:
            _ip("netns", "add", namespace)
        _ip("link", "add", "rw-veth0", "type", "veth", "peer", "name", "rw-veth1")
        for i, (namespace, address) in enumerate(HOSTS.items()):
            _ip("link", "set", f"rw-veth{i}", "netns", namespace)
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", f"rw-veth{i}")
            _ip("-n", namespace, "link", "set", f"rw-veth{i}", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        _remove_hosts()
        pytest.skip(f"cannot create network namespaces here: {e.stderr.strip()}")
    yield HOSTS
    _remove_hosts()


