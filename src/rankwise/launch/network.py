"""Which network interface the ranks of a multi-node job talk over.

gloo and NCCL advertise to their peers the address of ``GLOO_SOCKET_IFNAME`` /
``NCCL_SOCKET_IFNAME``, or else the address the machine's hostname resolves to.  On many
machines that is a loopback address (``127.0.1.1 myhost`` in ``/etc/hosts``): every rank
then tells the others to connect to 127.0.0.1, and a two-node job fails after a long wait
with ``Gloo connectFullMesh failed ... Connection refused, remote=[127.0.0.1]``
(pytorch/gloo#223, #335).  Unless the user chose an interface, rankwise picks the one
whose address the kernel would use to reach the master, sets both variables for the
workers, and says so.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from dataclasses import dataclass

from rankwise.errors import MasterUnreachable
from rankwise.logs import get_logger

log = get_logger(__name__)

VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class Interface:
    name: str
    address: str


def resolve(host: str) -> str:
    """An IPv4 address for ``host``; socket.gaierror when it does not resolve."""
    return socket.gethostbyname(host)


def route_to(master_addr: str) -> Interface | None:
    """The interface (and its address) this machine would use to reach ``master_addr``.

    A UDP socket's ``connect`` asks the kernel for a route and sends nothing.  The master
    itself gets its own address back, which belongs to the interface the other nodes reach.
    """
    import psutil

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((resolve(master_addr), 9))
            source = probe.getsockname()[0]
    except OSError:  # no route (a link down), or the name does not resolve
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == source for a in addresses):
            return Interface(name, source)
    return None


def hostname_is_loopback() -> bool:
    try:
        return resolve(socket.gethostname()).startswith("127.")
    except OSError:
        return False


def choose_interface(master_addr: str, node: str) -> str | None:
    """Set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for a multi-node job's workers; returns a line
    saying what was chosen and why (None when nothing was done)."""
    chosen = {name: os.environ[name] for name in VARIABLES if os.environ.get(name)}
    if chosen:
        return (
            f"{node}: using the interface you set "
            f"({', '.join(f'{k}={v}' for k, v in chosen.items())})"
        )
    interface = route_to(master_addr)
    if interface is None:
        return None
    if interface.address.startswith("127.") and not resolve(master_addr).startswith("127."):
        return None  # no route but loopback: leave gloo's own choice and its error
    for name in VARIABLES:
        os.environ[name] = interface.name
    note = (
        f"{node}: ranks talk over {interface.name} ({interface.address}), the interface that "
        f"routes to the master {master_addr} (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME set; export "
        "them to choose)"
    )
    if hostname_is_loopback():
        note += (
            f"; this machine's hostname {socket.gethostname()!r} resolves to a loopback address, "
            "which the ranks would otherwise advertise to each other"
        )
    return note


def is_this_machine(host: str) -> bool:
    """Whether ``host`` is one of this machine's own addresses (it then hosts the rendezvous
    store)."""
    try:
        address = resolve(host)
    except OSError:
        return False
    interface = route_to(host)
    return address.startswith("127.") or (interface is not None and interface.address == address)


def wait_for_master(host: str, port: int, timeout_s: float, node: str) -> None:
    """Return once ``host:port`` accepts a connection; ``MasterUnreachable`` naming this node, the
    address and the likely cause after ``timeout_s``.  Retries meanwhile: the master node may start
    later."""
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        try:
            with socket.create_connection(
                (host, port), timeout=max(0.5, min(5.0, deadline - time.monotonic()))
            ):
                return
        except OSError as e:
            last = e
        if time.monotonic() >= deadline:
            break
        if not said:
            log.info(
                f"rankwise: {node}: waiting for the master {host}:{port} (up to {timeout_s:g} s)",
                stderr=True,
                every_rank=True,
            )
            said = True
        time.sleep(1.0)
    interface = route_to(host)
    me = f"{socket.gethostname()}, {interface.address}" if interface else socket.gethostname()
    if isinstance(last, socket.gaierror):
        cause, fix = (
            f"the name does not resolve ({last})",
            "check --master-addr and DNS / /etc/hosts",
        )
    elif isinstance(last, ConnectionRefusedError):
        cause, fix = (
            "connection refused: nothing listens there",
            "start node 0 first, or check --master-port",
        )
    elif interface is None or getattr(last, "errno", None) in (
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
    ):
        cause, fix = (
            "no route to it",
            "check the network between the nodes (a link down?) and --master-addr",
        )
    else:
        cause, fix = "no answer (timed out)", "a firewall, a link down, or a wrong --master-addr"
    raise MasterUnreachable(
        f"{node} ({me}) cannot reach the master {host}:{port} within {timeout_s:g} s: {cause}; "
        f"{fix}"
    )
