"""What a benchmark measures in a script on ``rankwise.setup()``: ``rankwise bench --script`` runs it unchanged.

Each rank starts as ``python -m rankwise.tools.probe SCRIPT [ARGS]`` (under ``rankwise launch --strategy``),
which registers the :class:`Probe` as an observer of the script's Runtime (:mod:`rankwise.observers`) with the
settings the bench gives the processes (``RANKWISE_PROBE``: a directory, ``RANKWISE_PROBE_STEPS``: K,
``RANKWISE_PROBE_WARMUP``: W), then runs the script as ``__main__``.  The probe counts
the samples of each optimizer step (its loader's global batch x the accumulation ``prepare`` was
told), times the steps after W, and after step K writes ``probe.json`` (throughput, peak memory per
rank, what the model holds that can make ranks differ) from rank 0, and ends the script: the bench
caps the run at its own step count.  A benchmark whose timed window lasted under
``throughput.MIN_WINDOW_S`` runs on until it has (one decision, rank 0's, at step K); a script that ends
first reports the window it had.  Nothing in the script changes.  ``rankwise verify`` (and the bench's
equivalence column) adds a step-by-step trace (:mod:`rankwise.tools.trace`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

from rankwise import observers, process
from rankwise.checkpoint import write_text_atomic
from rankwise.launch.failures import record_for_launcher
from rankwise.launch.script import run_as_main
from rankwise.memory import peak_rss_megabytes
from rankwise.samples import batch_rows
from rankwise.throughput import MIN_WINDOW_S, WINDOW_DECISIONS, window_end
from rankwise.tools.trace import DROPOUT, FOLLOW, TRACE, StepTrace, model_facts

DIRECTORY, STEPS, WARMUP = "RANKWISE_PROBE", "RANKWISE_PROBE_STEPS", "RANKWISE_PROBE_WARMUP"
MIN_WINDOW = "RANKWISE_PROBE_MIN_WINDOW"
"""Seconds the timed window lasts at least (``bench --min-window``; default ``throughput.MIN_WINDOW_S``)."""
ENDED_FILE = "ended.json"
"""Written by rank 0 when the script ended before the probe's last step: how many steps it took."""


class Probe(observers.Observer):
    def __init__(self, directory: str, steps: int, warmup: int):
        self.directory, self.steps, self.warmup = Path(directory), steps, warmup
        self.global_batch: int | None = None
        self.grad_accum = 1
        self.rows = 0
        """Samples this rank passed through rt.to_device with gradients on, since the timing began."""
        self.facts: dict = {}
        self.started: float | None = None
        self.timed_from = 0
        self.end = steps
        """The step the probe ends the script at: ``steps``, then (a benchmark) later if the window was short."""
        self.decisions = 0
        self.min_window_s = MIN_WINDOW_S
        self.trace: StepTrace | None = None
        """What ``rankwise verify`` compares step by step; ``None`` for a benchmark."""

    @classmethod
    def from_environment(cls) -> Probe | None:
        if not os.environ.get(DIRECTORY):
            return None
        steps = int(os.environ.get(STEPS, "20"))
        steps = max(1 if os.environ.get(TRACE) == "1" else 2, steps)  # timing needs a warm-up step, a trace not
        probe = cls(os.environ[DIRECTORY], steps, max(1, min(int(os.environ.get(WARMUP, "3")), steps - 1)))
        probe.min_window_s = float(os.environ.get(MIN_WINDOW, MIN_WINDOW_S))
        if os.environ.get(TRACE) == "1":
            probe.trace = StepTrace(probe.directory, keep_dropout=os.environ.get(DROPOUT) == "keep",
                                    follow=os.environ.get(FOLLOW) or None)
        return probe

    def prepared(self, rt, model: nn.Module, grad_accum: int) -> None:
        """Before the strategy wraps ``model``."""
        self.grad_accum = grad_accum
        self.facts = model_facts(model)
        if self.trace:
            self.trace.prepared(rt, model)

    def batch(self, rt, batch) -> None:
        if self.started is not None and torch.is_grad_enabled():
            self.rows += batch_rows(batch)
        if self.trace:
            self.trace.batch(batch, rt.device)

    def backward(self, rt, loss: torch.Tensor) -> None:
        if self.trace:
            self.trace.backward(loss, rt.device)

    def before_step(self, rt, model: nn.Module, optimizer) -> None:
        if self.trace:
            self.trace.before_step(rt, model, optimizer)

    def loader(self, rt, global_batch: int, shuffle: bool) -> None:
        if shuffle:  # a training loader: its global batch is a step's samples (without accumulation)
            self.global_batch = global_batch

    def stepped(self, rt, model: nn.Module) -> None:
        """After optimizer step ``rt.steps``; at the last one, report and end the script (every rank)."""
        if rt.steps == self.warmup or self.started is None:  # (a resumed script starts past the warm-up)
            _synchronize(rt.device)
            self.started, self.rows, self.timed_from = time.perf_counter(), 0, rt.steps
        if self.trace:
            self.trace.stepped(rt, model)
        if rt.steps < self.end:
            return
        if self.trace is None and self.decisions < WINDOW_DECISIONS and rt.steps > self.timed_from:
            _synchronize(rt.device)
            self.decisions += 1
            # Why: every rank must stop at the same step, so rank 0's clock decides how long the window runs.
            self.end = rt.broadcast_object(window_end(rt.steps, self.timed_from, time.perf_counter() - self.started,
                                                      self.min_window_s))
            if rt.steps < self.end:
                return
        self._report(rt)
        raise observers.Finished()  # the probe measured its last step: every rank ends here, successfully

    def ended(self, rt) -> None:
        """The script's loop ended on its own, before the probe's last step (every rank, from ``Runtime.__exit__``):
        a benchmark past its asked steps still reports the window it measured; else rank 0 notes how far it got."""
        if self.trace is None and self.started is not None and rt.steps >= self.steps:
            self._report(rt, script_ended=True)
        elif rt.is_main:
            write_text_atomic(self.directory / ENDED_FILE, json.dumps({"steps": rt.steps}))

    def _report(self, rt, script_ended: bool = False) -> None:
        _synchronize(rt.device)
        seconds = time.perf_counter() - self.started
        cuda = torch.cuda.max_memory_allocated(rt.device) / 2**20 if rt.device.type == "cuda" else None
        # Why: rank 0 reports every rank's peak memory and the samples every rank's model saw.
        gathered = rt.all_gather_object((peak_rss_megabytes(), cuda, self.rows))
        memory = [(rss, device) for rss, device, _ in gathered]
        if rt.is_main:
            timed_steps = rt.steps - self.timed_from
            seen = sum(rows for _, _, rows in gathered)
            # What went through the model (rt.to_device) counts; else what the loader says a step holds.
            counted_by = "rt.to_device" if seen else ("rt.loader" if self.global_batch else None)
            per_step = seen / timed_steps if seen else (self.global_batch or 0) * self.grad_accum
            samples = per_step * timed_steps
            write_text_atomic(self.directory / "probe.json", json.dumps({
                "strategy": rt.strategy_name, "precision": rt.strategy.precision.name, "world_size": rt.world_size,
                "device": rt.device.type,
                "steps": rt.steps, "warmup_steps": self.timed_from, "timed_steps": timed_steps,
                "samples_per_step": per_step, "samples_counted_by": counted_by,
                "steady_s": round(seconds, 4), "script_ended": script_ended,
                "steady_samples_per_s": round(samples / seconds, 2) if samples and seconds > 0 else None,
                "peak_rss_mb": [rss for rss, _ in memory], "cuda_max_allocated_mb": [c for _, c in memory],
                "model": self.facts}, indent=2))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # Why: the clock must see the device's work, not just its queue


def main(argv: list[str] | None = None) -> int:
    """One rank of a measured script: ``RANKWISE_PROBE=DIR python -m rankwise.tools.probe SCRIPT.py [ARGS]``."""
    argv = sys.argv[1:] if argv is None else argv
    probe = Probe.from_environment()
    if not argv or probe is None:
        print(f"usage: {DIRECTORY}=DIR python -m rankwise.tools.probe SCRIPT.py [ARGS]", file=sys.stderr)
        return 2
    observers.register(probe)
    try:
        run_as_main(argv[0], argv[1:])
    except observers.Finished:
        pass  # the probe's last step: the Runtime closed cleanly on its way out
    except Exception as error:
        if not record_for_launcher(error):
            raise
        # The launcher's summary prints it once, for the rank that failed first: no traceback from every rank.
        process.destroy_process_group(clean=False)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
