"""``rankwise train``'s step-time breakdown (``profile_steps``): the steps right after the
throughput warm-up, profiled (:mod:`rankwise.measure.breakdown`), and left out of the steady
throughput, which starts after them."""

from __future__ import annotations

import contextlib

from rankwise.measure.breakdown import StepProfile, combine, model_facts


class LoopProfile:
    def __init__(self, rt, steps: int, after: int):
        self.rt = rt
        self.profile = StepProfile(steps) if steps else None
        if self.profile is not None:
            self.profile.after = after

    def mark(self, name: str):
        """A region of the step (forward, backward, optimizer), marked while profiling."""
        return self.profile.mark(name) if self.profile is not None else contextlib.nullcontext()

    def step_ended(self, step: int) -> None:
        """After optimizer step ``step`` (every rank): a profiled step closes, or profiling
        starts."""
        if self.profile is None:
            return
        self.profile.step_done()
        if step == self.profile.after:
            # Why: the profiled steps start together on every rank
            self.profile.start(self.rt.barrier)

    def breakdown(self, model, device: str, window_step_s: float | None) -> dict | None:
        """Every rank's parts (a collective: every rank calls it), for the run's summary;
        ``window_step_s``: the steady window's seconds a step (the profiler's cost is measured
        against it)."""
        if self.profile is None:
            return None
        # Why: rank 0's summary holds every rank's profiled steps, their arrivals compared.
        ranks = combine(self.rt.all_gather_object(self.profile.records()))
        if not ranks:
            return None
        first = self.profile.after + 1
        return {
            "steps": [first, first + ranks[0]["steps"] - 1],
            "ranks": ranks,
            "device": device,
            "window_step_ms": round(window_step_s * 1e3, 3) if window_step_s else None,
            "facts": model_facts([model]),
        }
