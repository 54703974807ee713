"""``rankwise train``'s step-time breakdown (``profile_steps``): every step of the timed window
(after the throughput warm-up) timed, with its wait for its batches
(:mod:`rankwise.measure.window_steps`); then the run's last steps profiled
(:mod:`rankwise.measure.breakdown`), left out of the steady throughput, for the breakdown to say
whether they explain the window.

The profiled steps come after the window, not before it: torch's profiler leaves its mark on the
steps that follow it (the built-in model's DDP rank: 3-6 % slower and 70 MB more resident memory
after five profiled steps), which a window after them would count against the row."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from time import perf_counter
from typing import TYPE_CHECKING

from rankwise.measure.breakdown import StepProfile, combine, model_facts
from rankwise.measure.records import Breakdown
from rankwise.measure.window_steps import summary as window_summary

if TYPE_CHECKING:
    from torch import nn


class LoopProfile:
    def __init__(self, rt, steps: int, after: int, window_from: int = 0):
        """Profile ``steps`` steps after step ``after``; time each step after ``window_from`` up to
        them (the timed window: from the warm-up's end to the profiled steps)."""
        self.rt = rt
        self.profile = StepProfile(steps) if steps else None
        if self.profile is not None:
            self.profile.after = after
        self.window_from = window_from
        self.step_seconds: list[float] = []
        """Each step's seconds in the timed window."""
        self.data_seconds: list[float] = []
        """Each of those steps' seconds waiting for its batches."""
        self.waited = 0.0
        self._stepped: float | None = None

    def mark(self, name: str):
        """A region of the step (forward, backward, optimizer), marked while profiling."""
        return self.profile.mark(name) if self.profile is not None else contextlib.nullcontext()

    def timed(self, loader):
        """``loader``, each wait for its next batch timed where the run profiles (else itself)."""
        return loader if self.profile is None else _Timed(loader, self)

    def step_ended(self, step: int) -> None:
        """After optimizer step ``step`` (every rank): in the window, the step's time and its wait
        for its batches; then a profiled step closes, or profiling starts."""
        if self.profile is None:
            return
        now = perf_counter()
        in_window = self.window_from < step <= self.profile.after
        if in_window and self._stepped is not None:
            self.step_seconds.append(now - self._stepped)
            self.data_seconds.append(self.waited)
        self._stepped = now if self.window_from <= step < self.profile.after else None
        self.waited = 0.0
        self.profile.step_done()
        if step == self.profile.after:
            # Why: the profiled steps start together on every rank
            self.profile.start(self.rt.barrier)

    def breakdown(
        self, model: nn.Module, device: str, window_step_s: float | None
    ) -> Breakdown | None:
        """Every rank's parts (a collective: every rank calls it), for the run's summary;
        ``window_step_s``: the steady window's seconds a step (the profiler's cost is measured
        against it)."""
        if self.profile is None:
            return None
        # Why: rank 0's summary holds every rank's profiled steps, their arrivals compared, and
        # every rank's later steps with their waits for data.
        gathered = self.rt.all_gather_object(
            (self.profile.records(), self.step_seconds, self.data_seconds)
        )
        ranks = combine([records for records, _, _ in gathered])
        if not ranks:
            return None
        first = self.profile.after + 1
        return {
            "steps": [first, first + ranks[0]["steps"] - 1],
            "ranks": ranks,
            "device": device,
            "window_step_ms": round(window_step_s * 1e3, 3) if window_step_s else None,
            "window": window_summary(
                [walls for _, walls, _ in gathered], [data for _, _, data in gathered]
            ),
            "facts": model_facts([model]),
        }


class _Timed:
    """A loader whose waits for each batch add up in its :class:`LoopProfile`."""

    def __init__(self, loader, owner: LoopProfile):
        self.loader, self.owner = loader, owner

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        batches = iter(self.loader)
        while True:
            fetching = perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                self.owner.waited += perf_counter() - fetching
            yield batch
