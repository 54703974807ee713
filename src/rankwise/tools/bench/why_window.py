"""Whether a bench row's profiled steps explain the timed window beside them, read from the window's
every step (:mod:`rankwise.measure.window_steps`).

A few steps are profiled; the row's throughput is the window's.  Where a rank waited for its data
over the window now and then (a slow sample in some batches, which five profiled steps may hold or
miss), or longer than its profiled steps showed, that wait is the row's cause, named with its rank
and the window's numbers.
Otherwise, where the profiled step is shorter than the window's by more than :data:`WINDOW_MISS`, or
longer by more than :data:`PROFILER_COST`, the breakdown explains another step than the one timed,
and the why line says so, with both numbers.
"""

from __future__ import annotations

from rankwise.measure.records import Breakdown, RankParts
from rankwise.measure.window_steps import RankWindow
from rankwise.tools.bench.records import Explanation

WINDOW_MISS = 0.25
"""A profiled step shorter than the window's by more than this share missed what slows the window:
the profiler only adds time, and the window and the profile leave out the machine's pauses alike
(the bench's repeats vary by about 15 % on 2 shared cores)."""
PROFILER_COST = 2.0
"""A profiled step longer than the window's by more than this share is the profiler's cost or the
machine's more than the script's: the profiler adds to every op, most where there are many small
ones (on 2 shared cores, +8 to +20 % on a small DDP model, up to +105 % with its gradients in 24
buckets)."""
DATA_NOISE = 0.10
"""A rank's data wait over the window is named where it is at least this share of the window's
step (:func:`_window_data`)."""


def window_step(breakdown: Breakdown) -> float | None:
    """The timed window's step the profiled steps are compared with (milliseconds): its every step
    where the window was timed so, a busy machine's pauses left out; else its mean."""
    window = breakdown.get("window")
    return (window.get("step_ms") if window else None) or breakdown.get("window_step_ms")


def timed_ranks(breakdown: Breakdown) -> list[RankWindow]:
    """Every rank's timed window (none where the window was not timed on every rank)."""
    window = breakdown.get("window")
    return (window.get("ranks") if window else None) or []


def explain_window(breakdown: Breakdown) -> Explanation | None:
    """The row's cause where its profiled steps do not stand for its window (None where they do)."""
    ranks = breakdown.get("ranks") or []
    window = window_step(breakdown)
    if not ranks or not window:
        return None
    data = _window_data(breakdown, window)
    if data is not None:
        return data
    profiled = max(r["step_ms"] for r in ranks)
    change = profiled / window - 1
    if -WINDOW_MISS <= change <= PROFILER_COST:
        return None
    steps = breakdown.get("steps")
    which = f"steps {steps[0]}-{steps[1]}" if steps else "the profiled steps"
    waits = [r["data_ms"] for r in timed_ranks(breakdown)]
    measured = (
        f"; over the window no rank waited more than {max(waits):.1f} ms a step for its data"
        if waits
        else ""
    )
    fix = (
        "the window spends time its profiled steps did not: look for work done only in some "
        "steps (evaluation, logging, checkpoints, a rank slow now and then), or run the row again "
        "on a quieter machine"
        if change < 0
        else "the profiler's own cost (many small ops) or a busy machine outweighs the script's "
        "step: run the row again on a quieter machine, or with more work a step"
    )
    return {
        "part": "unexplained",
        "rank": None,
        "ms": round(abs(window - profiled), 3),
        "share": round(abs(window - profiled) / window, 3),
        "line": f"cannot explain this row: its profiled {which} took {profiled:.1f} ms a step, the "
        f"timed window's step {window:.1f} ms ({change:+.0%}, beyond the noise of "
        f"-{WINDOW_MISS:.0%} to +{PROFILER_COST:.0%}){measured} → {fix}",
    }


def _now_and_then(rank: RankWindow, steps: int) -> bool:
    """Whether most of a rank's data wait over the window came in a few slow batches (at most half
    the steps): five profiled steps are no sample of it."""
    return 0 < rank["slow_batches"] <= steps / 2 and rank["slow_ms"] >= 0.5 * rank["data_ms"]


def _window_data(breakdown: Breakdown, window: float) -> Explanation | None:
    """The rank that waited longest for its data over the window, where that wait is at least
    :data:`DATA_NOISE` of the window's step and either came now and then (:func:`_now_and_then`)
    or the profiled steps showed :data:`DATA_NOISE` of the step less of it."""
    timed = timed_ranks(breakdown)
    window_steps = breakdown.get("window")
    steps = (window_steps.get("steps") if window_steps else None) or 0
    profiled = {r["rank"]: r for r in breakdown["ranks"]}
    found = [
        r
        for r in timed
        if r["rank"] in profiled
        and r["data_ms"] >= DATA_NOISE * window
        and (
            _now_and_then(r, steps)
            or r["data_ms"] - profiled[r["rank"]]["parts_ms"]["data"] >= DATA_NOISE * window
        )
    ]
    if not found:
        return None
    rank = max(found, key=lambda r: r["data_ms"])
    seen = profiled[rank["rank"]]
    now_and_then = (
        f", slow now and then: {rank['slow_batches']} of them over half a step, up to "
        f"{rank['data_max_ms']:.1f} ms"
        if _now_and_then(rank, steps)
        else ""
    )
    alone = len(breakdown["ranks"]) == 1
    others = "" if alone else "; the other ranks wait for it at the gradient exchange"
    return {
        "part": "data",
        "rank": rank["rank"],
        "ms": rank["data_ms"],
        "share": round(rank["data_ms"] / window, 3),
        "line": f"rank {rank['rank']} waits {rank['data_ms']:.1f} ms a step for its next batch "
        f"over the timed window's {steps} steps ({window:.1f} ms a step){now_and_then} "
        f"({workers(seen)}); its profiled steps showed {seen['parts_ms']['data']:.1f} ms{others} "
        "→ find the slow samples (__getitem__, the files they read), or hide them: "
        "DataLoader(num_workers=2 or more, persistent_workers=True)",
    }


def workers(rank: RankParts) -> str:
    """Where a rank's batches are built, from the loader its profiled steps named."""
    loader = rank.get("loader") or ""
    if loader.startswith("_SingleProcess"):
        return "num_workers=0: batches are built in the training process"
    return "its worker processes do not keep up" if loader else "the loader's own time"


def window_lines(breakdown: Breakdown) -> list[str]:
    """``--explain``'s lines on the window: every rank's step and data wait over all its steps."""
    window = breakdown.get("window")
    if not window:
        return []
    paused = f", {window['paused']} paused by the machine left out" if window["paused"] else ""
    lines = [f"  the timed window, every step ({window['steps']} steps{paused}):"]
    for r in window["ranks"]:
        lines.append(
            f"    rank {r['rank']}: {r['step_ms']:.1f} ms a step, {r['data_ms']:.2f} ms of it "
            f"waiting for data (the longest {r['data_max_ms']:.1f} ms; {r['slow_batches']} slow "
            "batches)"
        )
    return lines
