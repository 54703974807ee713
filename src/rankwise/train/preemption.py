"""SIGTERM / SIGINT (preemption, Ctrl-C) become a request to stop at a step boundary all ranks agree
on.

The signal handler only records the signal: saving a checkpoint inside a handler could
interrupt a collective half-way.  At each optimizer-step boundary every rank contributes
what it has seen to a tiny all-reduce started asynchronously at the previous boundary
(so no rank waits for it), and all ranks read the same result at the same step: they
stop together, the loop writes a checkpoint, and the process exits with 128 + signal
(143 for SIGTERM, 130 for SIGINT).  torchrun forwards its own SIGTERM to the workers and
gives them 30 s before it kills them; the spawn launcher forwards it the same way.
"""

from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as torch_dist

from rankwise import dist

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    def __init__(self):
        self.received = 0
        """The signal number seen by this process (0: none)."""
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
        self.received = signum  # nothing else in a handler: the loop acts at its next step boundary

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
