"""The timed window a watched run reports (``rankwise bench --script``): ``probe.json``, written by
rank 0.

:class:`Window` times every step and its wait for its batches; a benchmark's window starts after
its warm-up steps (and the steps it profiles for its step-time breakdown,
:class:`~rankwise.measure.breakdown.StepProfile`) and ends once it lasted ``min_window_s``; the
breakdown is checked against its every step (:mod:`rankwise.measure.window_steps`).
:func:`report`: samples per second over the window, every rank's peak memory, and the first step's
FLOPs against the matrix-product peak every rank measures at the end
(:mod:`rankwise.tools.watch.watched_mfu`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from rankwise.checkpoint import write_text_atomic
from rankwise.measure.breakdown import StepProfile, combine, model_facts
from rankwise.measure.memory import peak_rss_megabytes
from rankwise.measure.records import Breakdown
from rankwise.measure.throughput import window_end
from rankwise.measure.window_steps import summary as window_summary
from rankwise.tools.watch.models import ModelWatch
from rankwise.tools.watch.ranks import gather, rank_and_world
from rankwise.tools.watch.records import WatchedFacts
from rankwise.tools.watch.settings import WatchSettings
from rankwise.tools.watch.watched_mfu import StepFlops, utilisation

if TYPE_CHECKING:
    from rankwise.runtime import Runtime

RANK_PEAKS = "window-peaks-rank{rank}.json"
"""A rank's peak memory, written by every rank where the script left its group before the window's
end."""

Profiled = tuple[list[dict[str, Any]], list[float], list[float]]
"""One rank's profiled steps (:meth:`~rankwise.measure.breakdown.StepProfile.records`), and its
timed steps' seconds and their seconds waiting for batches."""


class Window:
    def __init__(self, settings: WatchSettings) -> None:
        steps, warmup = settings.watched_steps, settings.warmup
        self.min_window_s = settings.min_window_s
        self.flops = StepFlops()
        """A benchmark's FLOPs of the first step (a warm-up step: the counter's cost stays outside
        the window)."""
        self.flops_samples = 0
        # (fewer in a short run)
        profile_steps = max(0, min(settings.profile_steps, steps - warmup - 2))
        self.profile = (
            StepProfile(profile_steps) if profile_steps > 0 and not settings.trace else None
        )
        """A benchmark's step-time breakdown: ``profile_steps`` steps after its warm-up, profiled,
        on top of the steps asked, then its timed window (which the profiler's cost stays out
        of)."""
        self.warmup = warmup + (profile_steps if self.profile is not None else 0)
        """The steps before the timed window: the warm-up, then the profiled ones."""
        if self.profile is not None:
            self.profile.after = warmup
        # (profiled: extra steps)
        self.end = max(steps, warmup + 1) + (self.profile.steps if self.profile else 0)
        """The step the watcher ends the script at: ``steps``, then (a benchmark) later if the
        window was short."""
        self.started: float | None = None
        self.timed_samples = 0
        self.step_started = time.perf_counter()
        self.step_seconds: list[float] = []
        self.step_collective_seconds: list[float] = []
        """Each step's seconds in the script's own collectives."""
        self.step_data_seconds: list[float] = []
        """Each step's seconds waiting for its batches (the window's data wait, every step)."""
        self.reported = False

    def begin(self, part: str) -> None:
        """A part of the step begins (``forward``, ``optimizer``): profiled where a benchmark
        profiles it."""
        if self.profile is not None:
            self.profile.begin(part)

    def end_of(self, part: str) -> None:
        if self.profile is not None:
            self.profile.end(part)

    def stepped(
        self, step: int, samples: int, collective_seconds: float, data_seconds: float = 0.0
    ) -> float:
        """After optimizer step ``step`` (every rank) of ``samples`` samples, ``data_seconds`` of
        them waited for its batches: its time, and the window's; now."""
        if self.profile is not None:
            self.profile.end("optimizer")
            self.profile.step_done()
        now = time.perf_counter()
        self.step_seconds.append(now - self.step_started)
        self.step_collective_seconds.append(collective_seconds)
        self.step_data_seconds.append(data_seconds)
        self.step_started = now
        if step == 1:
            self.flops_samples = samples
        if self.profile is not None and step == self.profile.after:
            # Why a barrier: it aligns the ranks' clocks for the arrival times, every rank at this
            # same step.
            self.profile.start(lambda: gather(None))
        if step == self.warmup:
            self.started, self.timed_samples = now, 0
        elif self.started is not None:
            self.timed_samples += samples
        return now

    def goes_on(self, step: int, now: float) -> bool:
        """At its end step, whether a benchmark's window goes on: the end moves on, at the pace
        measured so far, until the window lasted ``min_window_s`` or reached its most steps (the
        pace changes under load)."""
        if self.started is None or step <= self.warmup:
            return False
        # Why: every rank must stop at the same step, so rank 0's clock decides how long the window
        # runs.
        self.end = gather(window_end(step, self.warmup, now - self.started, self.min_window_s))[0]
        return step < self.end


class ReportedWatcher(Protocol):
    """What :func:`report` reads of the watcher (:class:`~rankwise.tools.watch.watcher.Watcher`,
    which imports this module: a protocol it meets)."""

    settings: WatchSettings
    facts: WatchedFacts
    models: ModelWatch
    window: Window
    runtime: Runtime | None
    """The script's Runtime, where it runs on ``rankwise.setup()``."""

    @property
    def step(self) -> int: ...


def read_rank_peaks(directory: str | Path, result: dict[str, Any]) -> dict[str, Any]:
    """``result`` (probe.json's) with every rank's peak memory where each rank left its own file."""
    files = sorted(
        Path(directory).glob(RANK_PEAKS.format(rank="*")),
        key=lambda path: int(path.stem.rsplit("rank", 1)[1]),
    )
    if len(files) <= 1:
        return result
    peaks = [json.loads(path.read_text(encoding="utf-8")) for path in files]
    return {
        **result,
        "peak_rss_mb": [peak["peak_rss_mb"] for peak in peaks],
        "cuda_max_allocated_mb": [peak["cuda_max_allocated_mb"] for peak in peaks],
    }


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # (not on every platform)
        return None


def report(watcher: ReportedWatcher, script_ended: bool) -> None:
    """The window of ``watcher`` (a :class:`~rankwise.tools.watch.watcher.Watcher`), on every rank
    (collectives)."""
    rank, world = rank_and_world()
    window = watcher.window
    window.reported = True
    seconds = time.perf_counter() - window.started if window.started else None
    timed_samples, timed = window.timed_samples, watcher.step - window.warmup
    cuda = (
        torch.cuda.max_memory_allocated() / 2**20
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else None
    )
    # Why: rank 0 reports every rank's peak memory and the samples every rank trained on.
    gathered = gather((peak_rss_megabytes(), timed_samples, cuda))
    # Why: every rank measures its matrix-product peak at once (sharing the machine as in training),
    # after the gather above has brought them to the same point.
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if watcher.facts["device"] == "cuda"
        else torch.device(watcher.facts["device"])
    )
    counted = gather((window.flops.flops, window.flops_samples, window.flops.peak(device)))
    # Why: rank 0 combines every rank's profiled steps (arrival times against the last rank's) and
    # reads every rank's timed steps: how long each took, how long it waited for its batches.
    profiled = (
        gather(
            (
                window.profile.records(),
                window.step_seconds[window.warmup :],
                window.step_data_seconds[window.warmup :],
            )
        )
        if window.profile is not None
        else None
    )
    launched, counted_by, ranks = int(os.environ.get("WORLD_SIZE", "1")), "DataLoader", 1
    if world == 1 < launched:  # the script left its process group already: the ranks trained alike
        world, counted_by, ranks = launched, "DataLoader (rank 0's, x the world size)", launched
        # (no gather without a group: each rank leaves its own peak memory for the tool to read
        # back)
        write_text_atomic(
            watcher.settings.directory / RANK_PEAKS.format(rank=os.environ.get("RANK", "0")),
            json.dumps({"peak_rss_mb": gathered[0][0], "cuda_max_allocated_mb": gathered[0][2]}),
        )
    if rank == 0:
        samples = sum(count for _, count, _ in gathered) * ranks
        flops, peaks = [f for f, _, _ in counted], [p for _, _, p in counted]
        samples_by_rank = [s for _, s, _ in counted]
        write_text_atomic(
            watcher.settings.directory / "probe.json",
            json.dumps(
                {
                    "strategy": watcher.facts.get("strategy", "script"),
                    "world_size": world,
                    "device": watcher.facts["device"],
                    "steps": watcher.step,
                    "warmup_steps": window.warmup,
                    "timed_steps": timed,
                    "script_ended": script_ended,
                    "samples_per_step": samples / timed if timed else None,
                    "samples_counted_by": counted_by if samples else None,
                    "steady_s": round(seconds, 4) if seconds else None,
                    "steady_samples_per_s": round(samples / seconds, 2)
                    if samples and seconds
                    else None,
                    "precision": watcher.facts["precision"] if watcher.runtime else "as written",
                    "peak_rss_mb": [rss for rss, _, _ in gathered],
                    "cuda_max_allocated_mb": [c for _, _, c in gathered],
                    **utilisation(flops, samples_by_rank, peaks, device, window.flops.dtype, ranks),
                    "peak_flops_per_s_by_rank": [peak for _, _, peak in counted],
                    # (what else the machine ran: a disturbed row's evidence)
                    "load_average": _load_average(),
                    "breakdown": _breakdown(
                        watcher, profiled, seconds / timed if seconds and timed else None
                    ),
                    "flops_counted": "first step"
                    if window.flops.flops
                    else window.flops.skipped or None,
                    "model": {
                        "batch_dependent": watcher.facts["batch_dependent"],
                        "dropout": sorted({d["type"] for d in watcher.facts["dropout"]}),
                    },
                },
                indent=2,
            ),
        )


def _breakdown(
    watcher: ReportedWatcher, profiled: list[Profiled] | None, step_s: float | None
) -> Breakdown | None:
    """Every rank's step split into its parts (:mod:`rankwise.measure.breakdown`), from the steps
    profiled before the window, and the window's every step (:mod:`rankwise.measure.window_steps`):
    its time, and each rank's wait for its data."""
    ranks = combine([records for records, _, _ in profiled]) if profiled else []
    profile = watcher.window.profile  # (there whenever steps were profiled)
    if not profiled or not ranks or profile is None:
        return None
    first = profile.after + 1
    return {
        "steps": [first, first + ranks[0]["steps"] - 1],
        "ranks": ranks,
        "window_step_ms": round(step_s * 1e3, 3) if step_s else None,
        "window": window_summary(
            [list(walls) for _, walls, _ in profiled], [list(data) for _, _, data in profiled]
        ),
        "device": watcher.facts["device"],
        "facts": model_facts(watcher.models.live()),
    }
