"""Port and thread choices made before workers start."""

from __future__ import annotations

import os
import socket

from rankwise.env import threads_per_process


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(port: int, host: str = "") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False


def set_worker_threads(local_processes: int) -> int:
    """Export OMP_NUM_THREADS for the workers (cores / local processes) unless the user set it."""
    threads = threads_per_process(local_processes)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads
