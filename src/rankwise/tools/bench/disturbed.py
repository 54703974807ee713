"""A bench row whose figure cannot be true: something else shared the machine while it ran.

A new user's bench printed 7.05x, then 9.37x, for 2 processes against 1 on 2 cores: another job was
using the CPU during the one-process row, whose own measured matrix-product peak had fallen from
134-151 GFLOP/s to 17-65.  Such a row is *disturbed*: the report says so with the evidence, leaves
it out of "fastest", and says to rerun.  Three signs, each against a stated bound:

* a speedup beyond what the hardware allows (:data:`SPEEDUP_SLACK` x the row's devices or cores over
  the reference's);
* a matrix-product peak its ranks measured after the window (per GPU, or per core their threads use)
  that fell below :data:`PEAK_FALL` of the best any row measured on the same device at the same
  dtype;
* a spread over its repeats above :data:`SPREAD_BOUND` of their median.

The load average of the machine when the window ended is given with the evidence.
"""

from __future__ import annotations

import os
import statistics

from rankwise.process import usable_cores

SPEEDUP_SLACK = 1.5
"""How far past the hardware's ratio a speedup may go before it cannot be true (caches can make a
smaller share of the work per process more than proportionally faster, never by this much)."""
PEAK_FALL = 0.5
"""A row's ranks measured a matrix-product peak below this share of the best measured in the bench:
the cores were busy with something else."""
SPREAD_BOUND = 0.4
"""(fastest - slowest) / median over a row's repeats above this (±20 %): the runs did not measure
one thing."""


def units(processes: int, device: str) -> int:
    """What a row computes on: its GPUs, or the cores its processes' threads use."""
    if device == "cuda":
        return processes
    cores = usable_cores()
    # (each process's threads: the user's, else what the launcher sets)
    threads = os.environ.get("OMP_NUM_THREADS")
    return min(
        cores,
        processes * (int(threads) if threads and threads.isdigit() else max(1, cores // processes)),
    )


def rank_peaks(runs: list[dict], processes: int) -> list[float]:
    """Every rank's measured matrix-product peak over a row's runs, per GPU or per core its threads
    use (FLOP/s): a rank of two on two cores measures half what one process on both does, and
    neither was disturbed."""
    device = runs[0].get("device", "cpu") if runs else "cpu"
    share = 1 if device == "cuda" else units(processes, device) / processes
    return [
        peak / share for run in runs for peak in run.get("peak_flops_per_s_by_rank") or () if peak
    ]


def evidence(
    line: dict, runs: list[dict], reference: dict | None, best_peak: float | None
) -> list[str]:
    """Why ``line`` (a measured row, its good ``runs``) cannot be true; empty where nothing says so.
    ``reference``: the reference row's line; ``best_peak``: the best per-rank peak any row measured
    on this device and dtype."""
    said = []
    device = runs[0].get("device", "cpu") if runs else "cpu"
    if reference and line.get("speedup") and reference.get("processes"):
        # (processes too: one process's threads may scale poorly on a small model where processes do
        # not)
        bound = max(
            units(line["processes"], device) / units(reference["processes"], device),
            line["processes"] / reference["processes"],
        )
        if line["speedup"] > SPEEDUP_SLACK * bound:
            said.append(
                f"{line['speedup']:.2f}x is more than {line['processes']} process(es) on "
                f"{units(line['processes'], device)} {'GPU' if device == 'cuda' else 'core'}(s) "
                f"can give against {reference['processes']} on "
                f"{units(reference['processes'], device)} (at most {bound:.2g}x, x{SPEEDUP_SLACK} "
                "allowed): this row or the reference was disturbed"
            )
    peaks = rank_peaks(runs, line["processes"])
    if peaks and best_peak and statistics.median(peaks) < PEAK_FALL * best_peak:
        per = "GPU" if device == "cuda" else "core"
        said.append(
            f"its ranks measured a matrix-product peak of {_giga(min(peaks))}-{_giga(max(peaks))} "
            f"GFLOP/s per {per} against {_giga(best_peak)} in another row"
        )
    if line.get("spread") is not None and line["spread"] > SPREAD_BOUND:
        said.append(f"its repeats spread ±{line['spread'] / 2:.0%} (bound ±{SPREAD_BOUND / 2:.0%})")
    loads = [run["load_average"] for run in runs if run.get("load_average") is not None]
    if said and loads:
        said.append(
            f"load average {max(loads):.1f} on {usable_cores()} cores when its window ended"
        )
    return said


def mark(lines: list[dict], runs: dict[str, list[dict]], reference_row: str | None) -> None:
    """Mark each measured line whose figure cannot be true: ``disturbed`` (the evidence); every
    row's measured peak per rank is compared with the best of the bench on the same device and
    dtype."""
    best: dict[tuple, float] = {}
    for line in lines:
        for peak in rank_peaks(runs.get(line["row"], []), line["processes"]):
            key = _kind(line, runs[line["row"]])
            best[key] = max(best.get(key, 0.0), peak)
    reference = next(
        (line for line in lines if line["row"] == reference_row and line.get("status") == "ok"),
        None,
    )
    for line in lines:
        good = runs.get(line["row"], [])
        if line.get("status") != "ok" or not good:
            continue
        said = evidence(
            line, good, None if line is reference else reference, best.get(_kind(line, good))
        )
        if said:
            line["disturbed"] = "; ".join(said)


def _kind(line: dict, runs: list[dict]) -> tuple:
    return runs[0].get("device", "cpu") if runs else "cpu", line.get("precision")


def _giga(flops: float) -> str:
    return f"{flops / 1e9:.0f}"
