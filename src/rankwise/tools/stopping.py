"""Stopping a run a tool started, with every process it started.

A tool runs its launcher in a session of its own (:func:`rankwise.tools.harness.run_measured`), and
torchrun starts each worker in a session of its own too: neither a signal to the tool nor one to its
process group reaches the ranks.  :func:`stop_signals` turns a SIGTERM or SIGINT to the tool
(``timeout``, Slurm's ``scancel``, Kubernetes, Ctrl-C) into :class:`~rankwise.errors.Stopped`, and
:func:`stop_tree` then ends what it started: the launcher is asked first (it stops its ranks, which
write where they waited), and whatever is left after ``grace_s`` is killed, found by parentage, not
by session.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn

import psutil

from rankwise.errors import Stopped

STOP_GRACE_S = 15.0
"""How long a launcher has, once asked, to stop its ranks before everything left is killed."""
SIGNALS = (signal.SIGTERM, signal.SIGINT)

Handler = Callable[[int, FrameType | None], object] | signal.Handlers
"""What :func:`signal.signal` takes: a function of the signal and the frame, or SIG_IGN/SIG_DFL."""


@contextlib.contextmanager
def _handled(handler: Handler) -> Iterator[None]:
    """SIGTERM and SIGINT handled by ``handler`` while the block runs (where signals can be handled:
    the main thread; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


def _raise_stopped(signum: int, _frame: FrameType | None) -> NoReturn:
    raise Stopped(signum)


def stop_signals() -> contextlib.AbstractContextManager[None]:
    """While the block runs, SIGTERM and SIGINT raise :class:`Stopped` in it."""
    return _handled(_raise_stopped)


def ignored_stop_signals() -> contextlib.AbstractContextManager[None]:
    """SIGTERM and SIGINT ignored while the block runs: a stop under way is not cut short."""
    return _handled(signal.SIG_IGN)


def stop_tree(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> int:
    """End ``proc`` and every process it started: SIGTERM to ``proc``, up to ``grace_s`` for it to
    end, then SIGKILL to each one still running.  Returns how many processes ``proc`` had
    started."""
    family = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM) if grace_s > 0 else proc.kill()
    deadline = time.monotonic() + grace_s
    while proc.poll() is None and time.monotonic() < deadline:
        family |= _descendants(proc.pid)  # (a launcher may still be starting one)
        time.sleep(0.1)
    family |= _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()
    for child in family:  # the ranks outlive a killed launcher: each in a session of its own
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(family, timeout=5)
    return len(family)


def _descendants(pid: int) -> set[psutil.Process]:
    try:
        return set(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return set()
