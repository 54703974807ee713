"""Every timed step of a benchmark's window, on every rank: its time and its wait for its batches.

The step-time breakdown (:mod:`rankwise.measure.breakdown`) profiles a few steps; what it explains
is the window beside it only where those steps stand for the window's.  A slow sample that comes now
and then (a slow disk, one rank's odd file) slows a step in five or in ten, and the profiled steps
may hold none of them.  So each rank also times, for every step of the window, the step and the
time its DataLoader took to hand over the next batch (two clock reads a batch): :func:`summary`
reads them into the window's step and each rank's data wait over the whole window.

A step a busy machine paused is left out of the profiled steps' averages and of the window's alike
(:func:`paused`); a step slowed by one rank's wait for its data is the script's own, and is kept.
"""

from __future__ import annotations

import statistics
from typing import TypedDict

OUTLIER = 1.5
"""A step over this many times the median is a pause of the machine, left out of the averages,
unless a rank's wait for its next batch in that step accounts for half its excess."""
SLOW_BATCH = 0.5
"""A batch whose wait is over this share of the rank's typical step is a slow one."""


class RankWindow(TypedDict):
    """One rank's timed window (milliseconds; its paused steps left out)."""

    rank: int
    step_ms: float
    """The mean step."""
    data_ms: float
    """The mean wait a step for the next batch."""
    data_max_ms: float
    """The longest wait for one step's batches."""
    slow_batches: int
    """Steps whose wait was over :data:`SLOW_BATCH` of the rank's typical step."""
    slow_ms: float
    """Those steps' waits, a step of the window: how much of the data wait comes now and then."""


class WindowSteps(TypedDict):
    """The timed window's steps, every rank's (:func:`summary`)."""

    steps: int
    """Steps timed on every rank."""
    paused: int
    """Steps left out as the machine's pauses (:func:`paused`)."""
    step_ms: float
    """The window's mean step, its paused steps left out: the slowest rank's."""
    ranks: list[RankWindow]


def data_excess(data_by_rank: list[list[float]]) -> list[float]:
    """Per step, the most any rank waited for its next batch beyond its own median wait."""
    steps = min((len(data) for data in data_by_rank), default=0)
    typical = [statistics.median(data) if data else 0.0 for data in data_by_rank]
    return [
        max(data[i] - usual for data, usual in zip(data_by_rank, typical, strict=True))
        for i in range(steps)
    ]


def paused(walls: list[float], excess: list[float]) -> list[bool]:
    """Which of a rank's steps (``walls``, seconds) a busy machine paused: over :data:`OUTLIER`
    times the median, where no rank's wait for its next batch in that step (``excess``, from
    :func:`data_excess`) accounts for half the step's excess."""
    if not walls:
        return []
    typical = statistics.median(walls)
    return [
        wall > OUTLIER * typical and extra < 0.5 * (wall - typical)
        for wall, extra in zip(walls, excess, strict=True)
    ]


def summary(
    steps_by_rank: list[list[float]], data_by_rank: list[list[float]]
) -> WindowSteps | None:
    """The window from every rank's timed steps (seconds a step) and its waits for the next batch
    in each (seconds), rank by rank; None without a step timed on every rank."""
    steps = min((len(walls) for walls in [*steps_by_rank, *data_by_rank]), default=0)
    if not steps_by_rank or not steps:
        return None
    walls = [list(w[:steps]) for w in steps_by_rank]
    data = [list(d[:steps]) for d in data_by_rank]
    excess = data_excess(data)
    ranks: list[RankWindow] = []
    left_out = 0
    for rank, (rank_walls, rank_data) in enumerate(zip(walls, data, strict=True)):
        out = paused(rank_walls, excess)
        left_out = max(left_out, sum(out))
        kept = [i for i in range(steps) if not out[i]]
        typical = statistics.median(rank_walls)
        slow = [wait for wait in rank_data if wait > SLOW_BATCH * typical]
        ranks.append(
            {
                "rank": rank,
                "step_ms": _ms(statistics.fmean(rank_walls[i] for i in kept)),
                "data_ms": _ms(statistics.fmean(rank_data[i] for i in kept)),
                "data_max_ms": _ms(max(rank_data)),
                "slow_batches": len(slow),
                "slow_ms": _ms(sum(slow) / steps),
            }
        )
    return {
        "steps": steps,
        "paused": left_out,
        "step_ms": max(r["step_ms"] for r in ranks),
        "ranks": ranks,
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)
