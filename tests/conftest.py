import inspect
import logging
import os
import re
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


@pytest.fixture(autouse=True)
def rankwise_logger_restored():
    """A command run in this process gives the ``rankwise`` logger its terminal handler (``logs.to_terminal``): no
    later test inherits it, so each reads rankwise's messages the same way whatever ran before."""
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




# -- tiers ------------------------------------------------------------------------------------------------------
# `make test` runs every tier; `make test-fast` the unit tier (no process started, nothing installed, no root).
TIERS = ("unit", "multiproc", "multinode", "slurm", "gpu")
STARTS_PROCESSES = re.compile(
    r"\b(run_ranks|subprocess|Popen|spawn|watched_run|watched_runs|verify_runs|run_train|run_measured|"
    r"_bench|_verify|_launch|_run_cli|_train|run_all|horovodrun|torchrun|run_on_ranks|_phases)\b|\.main\(")
"""A call in a test's (or its fixtures') source that starts processes: the test is at least ``multiproc``."""


def _starts_processes(function, seen: set, depth: int = 0) -> bool:
    """Whether ``function``'s source, or a test helper it calls (followed a few calls deep), starts processes."""
    if depth > 4 or function in seen:
        return False
    seen.add(function)
    try:
        text = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    if STARTS_PROCESSES.search(text):
        return True
    names = getattr(function, "__globals__", {})
    for called in set(re.findall(r"\b([A-Za-z_][\w.]*)\(", text)):
        target = names.get(called.split(".")[0])
        for attribute in called.split(".")[1:]:
            target = getattr(target, attribute, None)
        if callable(target) and str(getattr(target, "__module__", "")).startswith("tests") and \
                _starts_processes(getattr(target, "__wrapped__", target), seen, depth + 1):
            return True
    return False


def _tier(item) -> str:
    path = str(item.fspath)
    fixtures = set(getattr(item, "fixturenames", ()))
    if "/tests/gpu/" in path:
        return "gpu"
    if "slurm" in path.rsplit("/", 1)[-1]:
        return "slurm"
    if "two_hosts" in fixtures or "multinode" in path.rsplit("/", 1)[-1]:
        return "multinode"
    functions = [item.function] + [definition.func for name in fixtures
                                   for definition in item._fixtureinfo.name2fixturedefs.get(name, ())
                                   if str(getattr(definition.func, "__module__", "")).startswith("tests")]
    seen: set = set()
    return "multiproc" if any(_starts_processes(function, seen) for function in functions) else "unit"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config, items):
    """Each test gets its tier's marker (an explicit one wins): ``pytest -m unit`` is the fast tier."""
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(getattr(pytest.mark, _tier(item)))
        if item.get_closest_marker("multinode") or item.get_closest_marker("slurm"):
            # Under pytest-xdist (`--dist loadgroup`), one worker runs every test that builds the two hosts: their
            # network namespaces and veth pair have fixed names.
            item.add_marker(pytest.mark.xdist_group("two-hosts"))
    if getattr(config.option, "numprocesses", None):
        # Under pytest-xdist the longest chain goes first (the two-host group, about 5 minutes on one worker), then the
        # tests that start processes, then the unit tier that fills the gaps at the end.  (A stable sort: every
        # worker collects the same order, which xdist requires.)
        rank = {"multinode": 0, "slurm": 0, "multiproc": 1, "gpu": 2, "unit": 2}
        items.sort(key=lambda item: min(rank[tier] for tier in TIERS if item.get_closest_marker(tier)))
