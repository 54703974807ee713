"""Where a multi-node job's layout comes from when it is not given flag by flag.

* a hostfile (``--hostfile hosts.txt``): one ``host slots=N`` line per node, ``#``
  comments; the first host is the master; this node is the line whose host is this
  machine (its hostname or one of its addresses), so the same command runs on every node;
* Kubernetes (Kubeflow's PyTorchJob with ``nprocPerNode``): the operator's ``PET_*``
  variables, which are torchrun's own flags as environment variables;
* Slurm, when ``srun`` starts one task per node (``srun -N2 --ntasks-per-node=1 rankwise train
  ...``): each task is its node's agent, which starts that node's workers itself.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

from rankwise.errors import ConfigError
from rankwise.process import first_slurm_host, slurm_port


@dataclass(frozen=True)
class Layout:
    """This node's place in a multi-node job."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


def parse_hostfile(path: str | Path) -> list[Host]:
    """``host slots=N`` lines (``slots`` defaults to 1); blank lines and ``#`` comments are
    skipped."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ConfigError(f"--hostfile {path}: {e.strerror}") from None
    hosts: list[Host] = []
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        slots = 1
        for field in fields[1:]:
            key, _, value = field.partition("=")
            if key != "slots" or not value.isdigit() or int(value) < 1:
                raise ConfigError(
                    f"{path}:{number}: expected 'HOST slots=N' with N >= 1, got {line.strip()!r}"
                )
            slots = int(value)
        if any(h.name == fields[0] for h in hosts):
            raise ConfigError(f"{path}:{number}: host {fields[0]!r} is listed twice")
        hosts.append(Host(fields[0], slots))
    if not hosts:
        raise ConfigError(f"{path}: no hosts (expected lines like 'node1 slots=4')")
    return hosts


def my_names() -> set[str]:
    """This machine's hostname, its short form and every IPv4 address of its interfaces."""
    import psutil

    names = {socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}
    for addresses in psutil.net_if_addrs().values():
        names.update(a.address for a in addresses if a.family == socket.AF_INET)
    return names


def layout_from_hostfile(path: str | Path, names: set[str] | None = None) -> Layout:
    hosts = parse_hostfile(path)
    names = my_names() if names is None else names
    mine = [i for i, host in enumerate(hosts) if host.name in names]
    if not mine:
        raise ConfigError(
            f"--hostfile {path}: this machine ({', '.join(sorted(names)[:4])}, ...) is none of its "
            f"hosts ({', '.join(h.name for h in hosts)}); list it by hostname or address"
        )
    node = mine[0]
    return Layout(
        nnodes=len(hosts),
        node_rank=node,
        nproc_per_node=hosts[node].slots,
        master_addr=hosts[0].name,
    )


KUBEFLOW = {
    "PET_NNODES": "nnodes",
    "PET_NODE_RANK": "node_rank",
    "PET_NPROC_PER_NODE": "nproc_per_node",
    "PET_MASTER_ADDR": "master_addr",
    "PET_MASTER_PORT": "master_port",
}
"""Kubeflow's PyTorchJob variables (torchrun flags) -> launch settings."""


def layout_from_kubeflow(env) -> dict | None:
    """Launch settings from a PyTorchJob pod's ``PET_*`` variables, or None outside one."""
    if "PET_NNODES" not in env:
        return None
    settings = {}
    for variable, key in KUBEFLOW.items():
        if variable in env:
            value = env[variable]
            settings[key] = value if key == "master_addr" else int(value.split(":")[-1])
    return settings


def layout_from_slurm(env) -> dict | None:
    """Launch settings of a node's agent that ``srun`` started once per node, or None elsewhere (and
    for a task that is itself a rank: several tasks per node).  Nodes and this node's rank are the
    job step's; the master is its first host, and the port follows from the job id, so every node
    agrees without talking."""
    # srun's step variables only: the batch script's own step (rankwise run without srun) has the
    # job's node count and node 0's id too, and would wait as node 0 for nodes that never come.
    if not all(
        key in env
        for key in ("SLURM_PROCID", "SLURM_NODEID", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS")
    ):
        return None
    nodes, tasks = int(env["SLURM_STEP_NUM_NODES"]), int(env["SLURM_STEP_NUM_TASKS"])
    if nodes < 2 or tasks != nodes:
        return None
    hosts = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    return {
        "nnodes": nodes,
        "node_rank": int(env["SLURM_NODEID"]),
        "master_addr": first_slurm_host(hosts),
        "master_port": slurm_port(env),
    }


def node_agent(env=os.environ) -> bool:
    """Whether this process was started as one node's agent (a Kubeflow pod, or one Slurm task per
    node), not as one rank: ``rankwise train`` then starts the node's workers itself."""
    return "PET_NNODES" in env or layout_from_slurm(env) is not None


def node_layout(hostfile: str | None, env=os.environ) -> dict:
    """Launch settings this node takes from a hostfile, else from a Kubeflow PyTorchJob pod's
    variables, else from Slurm (one task per node)."""
    if hostfile:
        return asdict(layout_from_hostfile(hostfile))
    return layout_from_kubeflow(env) or layout_from_slurm(env) or {}
