"""One rank of ``rankwise plan --validate``: a script on ``rankwise.setup()`` run for real, its
memory and step time measured.  ``python -m rankwise.tools.plan.probe SCRIPT [ARGS]`` under
``rankwise launch`` (its strategy and precision flags), with :data:`PROBE` naming the directory each
rank writes ``probe-rank<R>.json`` to.

Peak tensor memory, not resident memory: torch's profiler records every allocation and free of the
CPU allocator (``profile_memory=True``: each ``[memory]`` event carries the bytes, negative when
freed), which is what every tensor this rank holds goes through: the strategy's buffers (DDP's
buckets, DeepSpeed's flat partitions), gradients, optimizer state, activations.  It runs from before
the script starts, because it records no free of a block allocated before it started (FSDP and ZeRO
replace the model's parameters, and free them, after ``rt.prepare``). Live bytes at any moment = the
model's parameters and buffers when ``rt.prepare`` was called + the sum of the events from then to
that moment (what the script holds besides, its dataset, is left out).  The peak is their maximum
during an optimizer step, measured in each of :data:`MEASURED_STEPS` (the first steps allocate
lazily: the optimizer's state, DDP's rebuilt buckets) and reported as their median.  Resident memory
would add the interpreter, the libraries and the allocator's caching, none of which the plan models.
Not seen: memory a library allocates outside torch's allocator (gloo's own transport buffers).

The profiler records only the threads it profiles: a tensor whose last reference goes in another
thread (an async gloo collective's buffers, released by gloo's worker thread when the work
completes) is freed without an event, and counting its bytes as live would make memory grow step
after step.  Every event carries its block's address (in the profiler's trace), so the events are
read as a ledger: an allocation at the address of a block still live in it means that block was
freed, unseen, before; it stops counting there, the latest moment it can have been freed.

On a GPU the allocator's own count is the measure: ``torch.cuda.max_memory_allocated`` during each
measured step (reset after the one before), everything the rank holds on the device included.

Steady step time: after the memory is measured, the median interval between consecutive optimizer
steps over :data:`TIMED_STEPS` steps (the first interval after the profiler, which pays for reading
its events, left out).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypedDict

import torch
from torch import nn

from rankwise.runtime import observers

if TYPE_CHECKING:
    from rankwise.runtime import Runtime

PROBE = "RANKWISE_PLAN_PROBE"
"""Directory each measured rank writes its ``probe-rank<R>.json`` to."""
MEASURED_STEPS = (3, 4, 5)
"""The optimizer steps whose peak memory is measured (1-based)."""
TIMED_STEPS = 8
"""Intervals between optimizer steps the step time is the median of."""
MARK = "rankwise.plan.step"


class ProbeMemory(TypedDict):
    """One rank's tensor memory over the measured steps (:data:`MEASURED_STEPS`)."""

    peak_bytes: int
    """The median of ``step_peaks``: what the plan's memory is checked against."""
    step_peaks: list[int]
    """Peak live tensor bytes in each measured step."""
    held_bytes: int
    """Live tensor bytes at the end of the last measured step."""
    model_bytes: int
    """The model's parameters and buffers when ``rt.prepare`` was called."""


class ProbeRecord(ProbeMemory):
    """One rank's ``probe-rank<R>.json``: its memory, and its steady step time."""

    rank: int
    world_size: int
    strategy: str
    """The strategy the Runtime ran (``rankwise launch --strategy``)."""
    step_s: float
    """The median of ``step_intervals_s``: what the plan's step time is checked against."""
    step_intervals_s: list[float]
    """Seconds between consecutive optimizer steps over :data:`TIMED_STEPS` steps."""


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    storages: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr() or id(storage)] = storage.nbytes()
    return sum(storages.values())


def live_bytes(
    events: Iterable[tuple[float, int, int]], since: float, baseline: int
) -> list[tuple[float, int]]:
    """Live bytes after each memory event from ``since`` on (``baseline`` then), from ``(time,
    address, bytes)`` events sorted by time (bytes negative when freed).  A block allocated at an
    address still live in the ledger replaces one freed unseen (see the module's docstring): the
    older block stops counting, if it counted."""
    ledger: dict[int, tuple[int, bool]] = {}  # address -> (bytes, allocated since ``since``)
    live, series = baseline, []
    for at, address, nbytes in events:
        counted = at >= since
        if nbytes > 0:
            unseen_free = ledger.pop(address, None)
            if unseen_free is not None and unseen_free[1]:
                live -= unseen_free[0]
            ledger[address] = (nbytes, counted)
            live += nbytes if counted else 0
        else:
            ledger.pop(address, None)
            live += nbytes if counted else 0
        if counted:
            series.append((at, live))
    return series


def peak_between(
    series: list[tuple[float, int]], start: float, end: float, baseline: int
) -> tuple[int, int]:
    """``(peak live bytes in [start, end], live bytes at end)`` from :func:`live_bytes`'s series."""
    live, peak = baseline, None
    for at, now in series:
        if at > end:
            break
        live = now
        if at >= start:
            peak = live if peak is None else max(peak, live)
    return (peak if peak is not None else live), live


class Probe(observers.Observer):
    def __init__(self, directory: Path, cuda: bool = False) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.directory = directory
        # On a GPU the allocator counts for itself (torch.cuda.max_memory_allocated): no profiler.
        self.cuda = cuda
        self.profiler = (
            None if cuda else profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        )
        self.baseline = 0
        self.cuda_peaks: list[int] = []
        self.step_times: list[float] = []
        self.result: ProbeMemory | None = None

    def prepared(self, rt: Runtime, model: nn.Module, grad_accum: int) -> None:
        self.baseline = storage_bytes([*model.parameters(), *model.buffers()])
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(rt.device)
            return
        with torch.profiler.record_function(f"{MARK}0"):
            pass

    def stepped(self, rt: Runtime, model: nn.Module) -> None:
        step = rt.steps
        if self.cuda and step <= MEASURED_STEPS[-1]:
            if step in MEASURED_STEPS:
                self.cuda_peaks.append(torch.cuda.max_memory_allocated(rt.device))
            torch.cuda.reset_peak_memory_stats(rt.device)  # (the next step's peak is its own)
            if step == MEASURED_STEPS[-1]:
                self.result = {
                    "peak_bytes": int(statistics.median(self.cuda_peaks)),
                    "step_peaks": self.cuda_peaks,
                    "held_bytes": torch.cuda.memory_allocated(rt.device),
                    "model_bytes": self.baseline,
                }
                self.step_times.append(self._now())
            return
        if self.profiler is not None:
            with torch.profiler.record_function(f"{MARK}{step}"):
                pass
            if step == MEASURED_STEPS[-1]:
                self._measure_memory(rt)
            return
        self.step_times.append(self._now())
        if len(self.step_times) > TIMED_STEPS + 1:
            self._finish(rt)

    def _now(self) -> float:
        if self.cuda:
            # Why: a step's kernels run after the host returns; its end is when they end.
            torch.cuda.synchronize()
        return time.perf_counter()

    def _measure_memory(self, rt: Runtime) -> None:
        profiler, self.profiler = self.profiler, None
        # the measured steps ran under it (a CPU run: a GPU one has no profiler)
        assert profiler is not None
        profiler.__exit__(None, None, None)
        # (only the trace the profiler exports names each block's address)
        trace = self.directory / f"trace-rank{rt.rank}.json"
        self.directory.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
        trace.unlink()
        marks = {e["name"]: e["ts"] for e in events if e.get("name", "").startswith(MARK)}
        memory = sorted(
            (e["ts"], e["args"]["Addr"], e["args"]["Bytes"])
            for e in events
            if e.get("name") == "[memory]" and e["args"].get("Device Type", 0) == 0
        )
        series = live_bytes(memory, marks[f"{MARK}0"], self.baseline)
        peaks = []
        for step in MEASURED_STEPS:
            peak, after = peak_between(
                series, marks[f"{MARK}{step - 1}"], marks[f"{MARK}{step}"], self.baseline
            )
            peaks.append(peak)
        self.result = {
            "peak_bytes": int(statistics.median(peaks)),
            "step_peaks": peaks,
            "held_bytes": after,
            "model_bytes": self.baseline,
        }
        self.step_times.append(self._now())

    def _finish(self, rt: Runtime) -> NoReturn:
        times = self.step_times[1:]  # (the first interval paid for reading the profiler's events)
        intervals = [b - a for a, b in zip(times, times[1:])]
        # (the step times are taken from the last measured step on, after its memory)
        assert self.result is not None
        result: ProbeRecord = {
            **self.result,
            "rank": rt.rank,
            "world_size": rt.world_size,
            "strategy": rt.strategy_name,
            "step_s": statistics.median(intervals),
            "step_intervals_s": intervals,
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / f"probe-rank{rt.rank}.json").write_text(
            json.dumps(result), encoding="utf-8"
        )
        raise observers.Finished()


def main(argv: list[str] | None = None) -> int:
    from rankwise.launch.script import main as run_script

    argv = sys.argv[1:] if argv is None else argv
    if not argv or PROBE not in os.environ:
        print(
            f"usage: {PROBE}=DIR python -m rankwise.tools.plan.probe SCRIPT.py [ARGS]",
            file=sys.stderr,
        )
        return 2
    probe = Probe(Path(os.environ[PROBE]), cuda=torch.cuda.is_available())
    observers.register(probe)
    if probe.profiler is not None:
        probe.profiler.__enter__()
    status = run_script(argv)
    return status if isinstance(status, int) else 0 if status is None else 1


if __name__ == "__main__":
    sys.exit(main())
