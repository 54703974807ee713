"""What this machine allows a collective to reach, measured in the same run as the collectives.

- Loopback TCP between two processes (gloo's transport between local ranks): one direction
  alone, and each direction while both are busy — a 2-rank ring all_reduce sends and
  receives at once, so the second is its fair ceiling.
- One thread copying memory: a CPU collective copies (and adds) every byte at least once.

This module imports no torch at the top: the sender process it starts stays light.
"""

from __future__ import annotations

import multiprocessing
import socket
import statistics
import threading
import time

TCP_BYTES = 256 * 2**20
"""Bytes each direction carries per measurement."""
CHUNK = 4 * 2**20
REPEATS = 3


def _send(port: int, total: int, receive_too: bool) -> None:
    """The peer process: connect, send ``total`` bytes (and, if asked, receive as many at the same time)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        receiver = threading.Thread(target=_receive, args=(sock, total)) if receive_too else None
        if receiver:
            receiver.start()
        _transmit(sock, total)
        if receiver:
            receiver.join()
        sock.recv(1)  # wait until the other side has everything before closing


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
    """Bytes per second (GB/s) one direction of a loopback TCP connection between two processes carries."""
    # fork where there is one: the peer needs only sockets, and a spawned one would re-import torch.
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        peer = ctx.Process(target=_send, args=(server.getsockname()[1], total, both_directions), daemon=True)
        peer.start()
        try:
            server.settimeout(60)
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                started = time.perf_counter()
                sender = threading.Thread(target=_transmit, args=(conn, total)) if both_directions else None
                if sender:
                    sender.start()
                _receive(conn, total)
                if sender:
                    sender.join()
                seconds = time.perf_counter() - started
                conn.sendall(b"x")
        finally:
            peer.join(timeout=30)
            if peer.is_alive():
                peer.kill()
    return total / seconds / 1e9


def memcpy_GBps(nbytes: int = 64 * 2**20) -> float:
    """One thread copying ``nbytes`` from one buffer to another: bytes copied per second (GB/s), best of 5."""
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


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure() -> dict[str, float]:
    """Every ceiling, each the median of a few measurements (GB/s)."""
    return {
        "tcp_loopback_GBps": statistics.median(tcp_loopback_GBps(False) for _ in range(REPEATS)),
        "tcp_loopback_bidirectional_GBps": statistics.median(tcp_loopback_GBps(True) for _ in range(REPEATS)),
        "memcpy_1thread_GBps": memcpy_GBps(),
    }


if __name__ == "__main__":
    print(measure())
