"""Port, thread and allocator choices made before workers start."""

from __future__ import annotations

import os
import socket

from rankwise.process import threads_per_process


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


def set_worker_environment(local_processes: int) -> int:
    """Export the workers' environment; returns their thread count.

    - ``OMP_NUM_THREADS``: cores / local processes, unless the user set it.

    (The allocator is the strategy's business, not the launcher's: a rank whose strategy gathers and
    frees whole layers fixes glibc's mmap threshold itself,
    :func:`rankwise.process.fix_mmap_threshold`; fixed for every rank, it made a DDP step 60 %
    longer.)
    """
    threads = threads_per_process(local_processes)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads
