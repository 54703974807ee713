"""``rankwise doctor``: is this machine (and are these machines) ready for a distributed run?

Alone it checks this machine: versions, devices and backends, cores and threads, network
interfaces, whether the hostname resolves to a loopback address, whether the default port
is free.  With the multi-node flags, started on every node, it also checks what a job
needs between them: the master's name resolves, its port is reachable from every node,
the interface each node will use, versions agree across nodes, and finally a real
all_reduce over every rank with its bandwidth.  Every failed check names the node and
the likely fix; the exit code is 0 only if every check passed.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from rankwise.process import ProcessEnv
    from rankwise.tools.comm.records import CommRow
    from rankwise.tools.harness import NodeLayout

DEFAULT_PORT = 29500
"""The port checked on one machine when no --master-port is given (torchrun's default)."""
ALL_REDUCE_BYTES = 16 * 2**20


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class Report:
    node: int
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, ok: bool, detail: str, fix: str = "") -> Check:
        check = Check(name, ok, detail, fix)
        self.checks.append(check)
        return check

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def render(self) -> str:
        width = max(len(c.name) for c in self.checks)
        lines = []
        for c in self.checks:
            lines.append(
                f"[{'ok' if c.ok else 'FAIL':>4}] node {self.node}  {c.name:<{width}}  {c.detail}"
            )
            if not c.ok and c.fix:
                lines.append(f"       {'':>{len(str(self.node)) + 5}} {'':<{width}}  fix: {c.fix}")
        return "\n".join(lines)


def check_machine(report: Report, multi_node: bool, port: int) -> None:
    import psutil
    import torch
    import torch.distributed as torch_dist

    from rankwise.launch.network import hostname_is_loopback
    from rankwise.launch.ports import port_in_use
    from rankwise.process import usable_cores
    from rankwise.tools.machine import versions

    report.add("versions", True, ", ".join(f"{k} {v}" for k, v in versions().items()))
    cuda = torch.cuda.is_available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    report.add(
        "devices",
        True,
        f"{len(gpus)} CUDA device(s): {', '.join(gpus)}" if gpus else "CPU only (no CUDA)",
    )
    backends = {
        "gloo": torch_dist.is_gloo_available(),
        "nccl": torch_dist.is_nccl_available(),
        "mpi": torch_dist.is_mpi_available(),
    }
    report.add(
        "backends",
        backends["gloo"] or backends["nccl"],
        ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in backends.items()),
        "install a torch build with distributed support",
    )
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    report.add(
        "cores",
        True,
        f"{usable_cores()} usable, torch threads {torch.get_num_threads()}, OMP_NUM_THREADS "
        f"{threads} (launchers set cores / local processes)",
    )
    stats = psutil.net_if_stats()
    interfaces = []
    for name, addresses in psutil.net_if_addrs().items():
        ipv4 = [a.address for a in addresses if a.family == socket.AF_INET]
        if ipv4:
            down = "" if stats.get(name) and stats[name].isup else " (down)"
            interfaces.append(f"{name} {'/'.join(ipv4)}{down}")
    report.add("interfaces", bool(interfaces), "; ".join(interfaces) or "none with an IPv4 address")
    loopback = hostname_is_loopback()
    # Informational: on several nodes rankwise sets the interface itself (the "interface" check
    # below).
    report.add(
        "hostname",
        True,
        f"{socket.gethostname()!r} resolves to a {'loopback' if loopback else 'routable'} address"
        + (
            " (ranks would advertise it; rankwise sets GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to "
            "the interface that routes to the master instead)"
            if loopback
            else ""
        ),
    )
    free = not port_in_use(port)
    report.add(
        "port",
        free or multi_node,
        f"{port} is {'free' if free else 'in use'} on this machine",
        f"choose another --master-port than {port}",
    )


def check_nodes(report: Report, layout: NodeLayout) -> object | None:
    """The checks between nodes; returns the rendezvous store (None when the master is
    unreachable)."""
    from torch.distributed import TCPStore

    from rankwise.launch.network import resolve, route_to
    from rankwise.tools.machine import versions

    node = layout.node_rank
    try:
        address = resolve(layout.master_addr)
        report.add("master name", True, f"{layout.master_addr} resolves to {address}")
    except OSError as e:
        report.add(
            "master name",
            False,
            f"node {node} cannot resolve {layout.master_addr}: {e}",
            "check --master-addr and DNS / /etc/hosts",
        )
        return None
    interface = route_to(layout.master_addr)
    report.add(
        "interface",
        interface is not None
        and not interface.address.startswith("127.")
        or address.startswith("127."),
        f"node {node} reaches the master over {interface.name} ({interface.address})"
        if interface
        else f"node {node} has no route to {address}",
        "check the network between the nodes",
    )
    timeout = datetime.timedelta(seconds=layout.timeout_s)
    assert layout.master_port is not None  # several nodes: check_layout required --master-port
    try:
        store = TCPStore(
            layout.master_addr,
            layout.master_port,
            world_size=layout.nnodes,
            is_master=node == 0,
            timeout=timeout,
            wait_for_workers=False,
        )
        store.set(f"doctor/versions/{node}", json.dumps(versions()))
        report.add(
            "master port", True, f"node {node} reached {layout.master_addr}:{layout.master_port}"
        )
    except Exception as e:  # noqa: BLE001 - TCPStore raises several types for an unreachable or busy port
        why = (
            "it is in use here"
            if node == 0
            else "firewall, wrong --master-addr / --master-port, or node 0 not up"
        )
        report.add(
            "master port",
            False,
            f"node {node} cannot reach {layout.master_addr}:{layout.master_port}: "
            f"{str(e).splitlines()[0][:160]}",
            why,
        )
        return None
    try:
        store.wait([f"doctor/versions/{n}" for n in range(layout.nnodes)], timeout)
        everyone = [json.loads(store.get(f"doctor/versions/{n}")) for n in range(layout.nnodes)]
        differ = {
            k
            for k in everyone[0]
            if len({json.dumps(v.get(k)) for v in everyone}) > 1 and k != "rankwise"
        }
        report.add(
            "versions agree",
            not differ,
            "the same on every node"
            if not differ
            else "; ".join(
                f"{k}: " + ", ".join(f"node {n} {v.get(k)}" for n, v in enumerate(everyone))
                for k in sorted(differ)
            ),
            "install the same versions on every node",
        )
    except Exception as e:  # noqa: BLE001 - a node that never came up
        report.add(
            "versions agree",
            False,
            f"not every node reported within {layout.timeout_s} s: {e}",
            "start `rankwise doctor` with the same flags on every node",
        )
    return store


def measure_all_reduce(env: ProcessEnv, device: torch.device, size_bytes: int) -> CommRow:
    """On every rank (:func:`~rankwise.tools.harness.run_on_ranks`): ``rankwise comm bench``'s
    all_reduce measurement at ``size_bytes`` fp32, correctness included; rank 0's row reaches the
    report."""
    import torch

    from rankwise.tools.comm.bench import OPS, measure

    return measure(OPS["all_reduce"], size_bytes, torch.float32, device, iters=5, warmup=1)


def check_all_reduce(report: Report, layout: NodeLayout) -> None:
    from rankwise.errors import LaunchError
    from rankwise.tools.harness import resolve_backend, run_on_ranks

    backend = resolve_backend("auto", layout.nproc_per_node)
    assert layout.master_port is not None  # several nodes: check_layout required --master-port
    try:
        # The next port: node 0 still hosts the doctor's own store on --master-port.
        row = run_on_ranks(
            measure_all_reduce,
            (ALL_REDUCE_BYTES,),
            layout,
            backend,
            master_port=layout.master_port + 1,
        )
    except LaunchError as e:
        report.add(
            "all_reduce",
            False,
            f"node {layout.node_rank}: {str(e).splitlines()[1].strip()[:200]}",
            "see the checks above; GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, firewalls",
        )
        return
    if row is None:
        report.add(
            "all_reduce", True, "this node's ranks took part (rank 0's node reports the bandwidth)"
        )
        return
    ranks = layout.nproc_per_node * layout.nnodes
    report.add(
        "all_reduce",
        row["wrong"] == 0,
        f"{ranks} ranks on {backend}, {row['bytes'] / 2**20:.0f} MiB fp32: "
        f"{row['time_us'] / 1e3:.1f} ms, algbw {row['algbw_GBps']:.2f} GB/s, busbw "
        f"{row['busbw_GBps']:.2f} GB/s",
        f"{row['wrong']} element(s) of the sum were wrong: report it with the versions above",
    )


def run(layout: NodeLayout) -> int:
    multi_node = layout.nnodes > 1
    report = Report(layout.node_rank)
    check_machine(report, multi_node, layout.master_port or DEFAULT_PORT)
    if multi_node:
        store = check_nodes(report, layout)
        # a node missing already: an all_reduce would only wait for it
        if store is not None and report.ok:
            check_all_reduce(report, layout)
    print(report.render(), flush=True)
    failed = [c for c in report.checks if not c.ok]
    print(
        f"node {layout.node_rank}: "
        + (
            "every check passed"
            if not failed
            else f"{len(failed)} check(s) failed: {', '.join(c.name for c in failed)}"
        )
    )
    return 0 if not failed else 1
