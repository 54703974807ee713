"""SIGTERM / SIGINT (preemption, Ctrl-C) become a request to stop at a step boundary all ranks agree
on.

The signal handler only records the signal: saving a checkpoint inside a handler could
interrupt a collective half-way.  At each optimizer-step boundary every rank contributes
what it has seen to a tiny all-reduce started asynchronously at the previous boundary
(so no rank waits for it), and all ranks read the same result at the same step: they
stop together, the loop writes a checkpoint, and the process exits with 128 + signal
(143 for SIGTERM, 130 for SIGINT).  torchrun forwards its own SIGTERM to the workers and
gives them 30 s before it kills them; the spawn launcher forwards it the same way.

A step boundary can be far off: the first step of a compiled model compiles for a minute or more,
an evaluation or a checkpoint write runs between steps.  From the signal, the loop has
:data:`GRACE_S` to stop there; a process still running then ends where it is, with the same exit
status, and says so.  The checkpoint it was writing (if any) stays unfinished in its staging
directory: the last one finished, renamed into place whole, is what ``--resume latest`` finds.
"""

from __future__ import annotations

import os
import signal
import threading

import torch
import torch.distributed as torch_dist

from rankwise import dist

SIGNALS = (signal.SIGTERM, signal.SIGINT)

GRACE_S = 20.0
"""Seconds from a stop signal to the end of the process, at the latest: torchrun, rankwise's spawn
launcher and Slurm's default ``KillWait`` send SIGKILL 30 s after SIGTERM; 20 leaves the rest for
the teardown."""


class StopRequest:
    def __init__(self, grace_s: float = GRACE_S):
        self.received = 0
        """The signal number seen by this process (0: none)."""
        self.grace_s = grace_s
        self._deadline: threading.Timer | None = None
        # Handlers can only be installed from the main thread; elsewhere signals keep their default
        # action.
        on_main_thread = threading.current_thread() is threading.main_thread()
        self._previous = (
            {sig: signal.signal(sig, self._record) for sig in SIGNALS} if on_main_thread else {}
        )
        self._distributed = dist.world_size() > 1
        self._group = dist.cpu_group() if self._distributed else None
        self._buffer = torch.zeros(1, dtype=torch.int64)
        self._pending = None

    def _record(self, signum, frame) -> None:
        # nothing else in a handler: the loop acts at its next step boundary, within the grace
        if not self.received:
            self.received = signum
            self._deadline = threading.Timer(self.grace_s, self._stop_now, args=(signum,))
            self._deadline.daemon = True  # (a process that ends first is not kept alive by it)
            self._deadline.start()

    def _stop_now(self, signum: int) -> None:
        """The grace is over and the process still runs (the loop never reached a step boundary,
        or its teardown hangs): end it here, from the timer's thread.  (``os.write``: the main
        thread may hold a logging lock.)"""
        rank = f"rank {torch_dist.get_rank()}: " if self._distributed else ""
        os.write(
            2,
            (
                f"rankwise: {rank}stopped by {signal.Signals(signum).name} {self.grace_s:.0f} s "
                "ago and no step boundary reached since (a compile, an evaluation or a checkpoint "
                "write was under way): ending now; the last finished checkpoint is kept\n"
            ).encode(),
        )
        os._exit(128 + signum)

    def agreed(self) -> int:
        """At a step boundary: the signal every rank now agrees to stop for, or 0 to go on."""
        if not self._distributed:
            return self.received
        if self._pending is not None:
            self._pending.wait()  # started a whole step ago: long done
            agreed = int(self._buffer.item())  # a CPU tensor of the gloo group: no device sync
            if agreed:
                return agreed
        self._buffer = torch.tensor([self.received], dtype=torch.int64)
        # Why: every rank must stop at the same step (a checkpoint is collective); started now and
        # read at the next boundary, so it never holds a step up.
        self._pending = torch_dist.all_reduce(
            self._buffer, op=torch_dist.ReduceOp.MAX, group=self._group, async_op=True
        )
        return 0

    def close(self, wait: bool = True) -> None:
        if self._pending is not None and wait:
            self._pending.wait()  # no collective left in flight when the group is torn down
        self._pending = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
