"""The timed window a watched run reports (``rankwise bench --script``): ``probe.json``, written by rank 0.

Samples per second over the window after its warm-up steps, every rank's peak memory, and the first step's FLOPs
against the matrix-product peak every rank measures at the end (:mod:`rankwise.tools.watch.flops`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from rankwise.breakdown import combine, model_facts
from rankwise.checkpoint import write_text_atomic
from rankwise.memory import peak_rss_megabytes
from rankwise.tools.watch.flops import utilisation
from rankwise.tools.watch.ranks import gather, rank_and_world

RANK_PEAKS = "window-peaks-rank{rank}.json"
"""A rank's peak memory, written by every rank where the script left its group before the window's end."""


def read_rank_peaks(directory, result: dict) -> dict:
    """``result`` (probe.json's) with every rank's peak memory where each rank left its own file."""
    files = sorted(Path(directory).glob(RANK_PEAKS.format(rank="*")),
                   key=lambda path: int(path.stem.rsplit("rank", 1)[1]))
    if len(files) <= 1:
        return result
    peaks = [json.loads(path.read_text(encoding="utf-8")) for path in files]
    return {**result, "peak_rss_mb": [peak["peak_rss_mb"] for peak in peaks],
            "cuda_max_allocated_mb": [peak["cuda_max_allocated_mb"] for peak in peaks]}


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # (not on every platform)
        return None


def report(watcher, script_ended: bool) -> None:
    """The window of ``watcher`` (a :class:`~rankwise.tools.watch.watcher.Watcher`), on every rank (collectives)."""
    rank, world = rank_and_world()
    seconds = time.perf_counter() - watcher.started if watcher.started else None
    timed_samples, timed = watcher.timed_samples, watcher.step - watcher.warmup
    cuda = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() and \
        torch.cuda.is_initialized() else None
    # Why: rank 0 reports every rank's peak memory and the samples every rank trained on.
    gathered = gather((peak_rss_megabytes(), timed_samples, cuda))
    # Why: every rank measures its matrix-product peak at once (sharing the machine as in training), after the
    # gather above has brought them to the same point.
    device = torch.device("cuda", torch.cuda.current_device()) if watcher.facts["device"] == "cuda" else \
        torch.device(watcher.facts["device"])
    counted = gather((watcher.flops.flops, watcher.flops_samples, watcher.flops.peak(device)))
    # Why: rank 0 combines every rank's profiled steps (arrival times against the last rank's).
    profiled = gather(watcher.profile.records()) if watcher.profile is not None else None
    launched, counted_by, ranks = int(os.environ.get("WORLD_SIZE", "1")), "DataLoader", 1
    if world == 1 < launched:  # the script left its process group already: the ranks trained alike
        world, counted_by, ranks = launched, "DataLoader (rank 0's, x the world size)", launched
        # (no gather without a group: each rank leaves its own peak memory for the tool to read back)
        write_text_atomic(watcher.directory / RANK_PEAKS.format(rank=os.environ.get("RANK", "0")), json.dumps(
            {"peak_rss_mb": gathered[0][0], "cuda_max_allocated_mb": gathered[0][2]}))
    if rank == 0:
        samples = sum(count for _, count, _ in gathered) * ranks
        write_text_atomic(watcher.directory / "probe.json", json.dumps({
            "strategy": watcher.facts.get("strategy", "script"), "world_size": world, "device": watcher.facts["device"],
            "steps": watcher.step,
            "warmup_steps": watcher.warmup, "timed_steps": timed, "script_ended": script_ended,
            "samples_per_step": samples / timed if timed else None,
            "samples_counted_by": counted_by if samples else None,
            "steady_s": round(seconds, 4) if seconds else None,
            "steady_samples_per_s": round(samples / seconds, 2) if samples and seconds else None,
            "precision": watcher.facts["precision"] if watcher.runtime else "as written",
            "peak_rss_mb": [rss for rss, _, _ in gathered],
            "cuda_max_allocated_mb": [c for _, _, c in gathered],
            **utilisation(*map(list, zip(*counted, strict=True)), device, watcher.flops.dtype, ranks),
            "peak_flops_per_s_by_rank": [peak for _, _, peak in counted],
            "load_average": _load_average(),  # (what else the machine ran: a disturbed row's evidence)
            "breakdown": _breakdown(watcher, profiled, seconds / timed if seconds and timed else None),
            "flops_counted": "first step" if watcher.flops.flops else watcher.flops.skipped or None, "model": {
                "batch_dependent": watcher.facts["batch_dependent"],
                "dropout": sorted({d["type"] for d in watcher.facts["dropout"]})}}, indent=2))


def _breakdown(watcher, profiled: list[list[dict]] | None, step_s: float | None) -> dict | None:
    """Every rank's step split into its parts (:mod:`rankwise.breakdown`), from the steps profiled before the
    window."""
    ranks = combine(profiled) if profiled else []
    if not ranks:
        return None
    first = watcher.profile.after + 1
    return {"steps": [first, first + ranks[0]["steps"] - 1], "ranks": ranks,
            "window_step_ms": round(step_s * 1e3, 3) if step_s else None, "device": watcher.facts["device"],
            "facts": model_facts(ref() for ref in watcher.models if ref() is not None)}
