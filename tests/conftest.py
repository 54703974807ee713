import contextlib
import logging
import os
import shutil
import subprocess

import pytest
import torch.distributed as torch_dist

from tests.support.long import is_long
from tests.support.tiers import (
    TIERS,
    no_process_started,
    shares_a_started_fixture,
    starts_processes,
    tier_of,
)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_DIST_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    # what `rankwise launch` sets
    "RANKWISE_STRATEGY",
    "RANKWISE_PRECISION",
    "RANKWISE_OPTIONS",
)


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


@pytest.fixture(autouse=True)
def rankwise_logger_restored():
    """A command run in this process gives the ``rankwise`` logger its terminal handler
    (``logs.to_terminal``): no later test inherits it, so each reads rankwise's messages the same
    way whatever ran before."""
    logger = logging.getLogger("rankwise")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


HOSTS = {"rw-node0": "10.213.8.1", "rw-node1": "10.213.8.2"}
"""Two network namespaces joined by a veth pair: two hosts for multi-node tests."""
MASTER = HOSTS["rw-node0"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _remove_hosts() -> None:
    for namespace in HOSTS:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


@pytest.fixture(scope="session")
@starts_processes("multinode")
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


# -- tiers -----------------------------------------------------------------------------------------
# `make test` runs every tier; `make test-fast` the unit tier (no process started, nothing
# installed, no root). Tiers are marked explicitly (tests/support/tiers.py): a test's own marker,
# else what its fixtures declare, else unit -- and a unit test that starts a process fails, so a
# missing marker cannot hide in the fast tier.


# before pytest-xdist's own, which reads the xdist_group marks added here
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Each test gets its tier's marker (an explicit one wins): ``pytest -m unit`` is the fast
    tier."""
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(getattr(pytest.mark, tier_of(item)))
        if item.get_closest_marker("multinode") or item.get_closest_marker("slurm"):
            # Under pytest-xdist (`--dist loadgroup`), one worker runs every test that builds the
            # two hosts: their network namespaces and veth pair have fixed names.
            item.add_marker(pytest.mark.xdist_group("two-hosts"))
        elif shares_a_started_fixture(item):
            # A module's fixture that starts ranks runs once per worker that runs one of its tests:
            # its tests go to one worker, so it runs once (the bench summary: 253 s, not twice).
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
        if is_long(item.nodeid):
            item.add_marker(pytest.mark.long)  # make test-long (tests/support/long.py)
    if getattr(config.option, "numprocesses", None):
        # Under pytest-xdist the longest chain goes first (the two-host group, about 5 minutes on
        # one worker), then the tests that start processes, then the unit tier that fills the gaps
        # at the end.  (A stable sort: every worker collects the same order, which xdist requires.)
        rank = {"multinode": 0, "slurm": 0, "multiproc": 1, "gpu": 2, "unit": 2, "docs": 1}
        items.sort(
            key=lambda item: min(rank[tier] for tier in TIERS if item.get_closest_marker(tier))
        )


def _unit_only(item):
    """Refuse a process start inside a unit-tier test: its fixtures' set-up and its body.  (Not its
    teardown: that also ends the module and session fixtures earlier tests left, such as two_hosts,
    which runs `ip netns del`.)"""
    return (
        no_process_started(item.nodeid)
        if item.get_closest_marker("unit")
        else contextlib.nullcontext()
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _unit_only(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _unit_only(item):
        return (yield)
