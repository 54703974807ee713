"""What this machine allows a collective to reach, measured in the same run as the collectives.

- Loopback TCP between two processes (gloo's transport between local ranks): one direction
  alone, and each direction while both are busy — a 2-rank ring all_reduce sends and
  receives at once, so the second is its fair ceiling.
- One thread copying memory: a CPU collective copies (and adds) every byte at least once.
- Across nodes, TCP between node 0 and node 1 (one way, and each way with both busy): the
  link every inter-node collective crosses.

This module imports no torch at the top: the sender process it starts stays light.
"""

from __future__ import annotations

import multiprocessing
import socket
import statistics
import threading
import time
from collections.abc import Callable

TCP_BYTES = 256 * 2**20
"""Bytes each direction carries per measurement."""
CHUNK = 4 * 2**20
REPEATS = 3


def _send(port: int, total: int, receive_too: bool) -> None:
    """The loopback peer process: connect, then one round of ``_peer_round``."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _peer_round(sock, total, receive_too)


def _transmit(sock: socket.socket, total: int) -> None:
    data = memoryview(bytearray(CHUNK))
    sent = 0
    while sent < total:
        sock.sendall(data[: min(CHUNK, total - sent)])
        sent += min(CHUNK, total - sent)


def _receive(sock: socket.socket, total: int) -> None:
    buffer = memoryview(bytearray(CHUNK))
    got = 0
    while got < total:
        n = sock.recv_into(buffer, min(CHUNK, total - got))
        if n == 0:
            raise ConnectionError(f"the peer closed the connection after {got} of {total} bytes")
        got += n


def tcp_loopback_GBps(both_directions: bool, total: int = TCP_BYTES) -> float:
    """Bytes per second (GB/s) one direction of a loopback TCP connection between two processes
    carries."""
    # fork where there is one: the peer needs only sockets, and a spawned one would re-import torch.
    ctx = (
        multiprocessing.get_context("fork")
        if "fork" in multiprocessing.get_all_start_methods()
        else multiprocessing.get_context("spawn")
    )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        peer = ctx.Process(
            target=_send, args=(server.getsockname()[1], total, both_directions), daemon=True
        )
        peer.start()
        try:
            server.settimeout(60)
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                speed = _measure_on(conn, total, both_directions)
        finally:
            peer.join(timeout=30)
            if peer.is_alive():
                peer.kill()
    return speed


def _at_once(
    conn: socket.socket,
    total: int,
    both_directions: bool,
    mine: Callable[[socket.socket, int], object],
    theirs: Callable[[socket.socket, int], object],
) -> None:
    """``mine(conn, total)``; with ``both_directions``, ``theirs`` in a thread at the same time."""
    other = threading.Thread(target=theirs, args=(conn, total)) if both_directions else None
    if other:
        other.start()
    mine(conn, total)
    if other:
        other.join()


def _measure_on(conn: socket.socket, total: int, both_directions: bool) -> float:
    """The receiving side of one measurement on an open connection (the peer runs
    ``_peer_round``)."""
    started = time.perf_counter()
    _at_once(conn, total, both_directions, _receive, _transmit)
    seconds = time.perf_counter() - started
    conn.sendall(b"x")  # done: the peer may start the next round
    return total / seconds / 1e9


def _peer_round(conn: socket.socket, total: int, both_directions: bool) -> None:
    _at_once(conn, total, both_directions, _transmit, _receive)
    conn.recv(1)


def between_nodes(
    node_rank: int, master_addr: str, port: int, timeout_s: float, total: int = TCP_BYTES
) -> dict[str, float]:
    """TCP between node 0 (which listens on ``port`` and returns the numbers) and node 1 (which
    connects).

    Both nodes call it with the same arguments before their ranks start; other nodes return at once.
    """
    if node_rank > 1:
        return {}
    rounds = [both for both in (False, True) for _ in range(REPEATS)]
    if node_rank == 1:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                conn = socket.create_connection((master_addr, port), timeout=timeout_s)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # node 0 is not listening yet
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for both in rounds:
                _peer_round(conn, total, both)
        return {}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", port))
        server.listen(1)
        server.settimeout(timeout_s)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(timeout_s)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            speeds = [(both, _measure_on(conn, total, both)) for both in rounds]
    return {
        "tcp_between_nodes_GBps": statistics.median(v for both, v in speeds if not both),
        "tcp_between_nodes_bidirectional_GBps": statistics.median(v for both, v in speeds if both),
    }


def memcpy_GBps(nbytes: int = 64 * 2**20) -> float:
    """One thread copying ``nbytes`` from one buffer to another: bytes copied per second (GB/s),
    best of 5."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        source = torch.ones(nbytes, dtype=torch.uint8)
        target = torch.empty_like(source)
        target.copy_(source)  # touch the pages first
        best = min(_timed(lambda: target.copy_(source)) for _ in range(5))
    finally:
        torch.set_num_threads(threads)
    return nbytes / best / 1e9


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure() -> dict[str, float]:
    """Every ceiling, each the median of a few measurements (GB/s)."""
    return {
        "tcp_loopback_GBps": statistics.median(tcp_loopback_GBps(False) for _ in range(REPEATS)),
        "tcp_loopback_bidirectional_GBps": statistics.median(
            tcp_loopback_GBps(True) for _ in range(REPEATS)
        ),
        "memcpy_1thread_GBps": memcpy_GBps(),
    }


if __name__ == "__main__":
    print(measure())
