"""What a watched rank saw, written at its end for the findings that need no reference
(:mod:`rankwise.tools.watch.findings`): its passes over the data, the script's collectives, reads
and saves, its steps' times, how the script ended."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rankwise.checkpoint import write_text_atomic
from rankwise.tools.watch.frameworks import framework_world_size
from rankwise.tools.watch.loaders import RANK_RECORD
from rankwise.tools.watch.ranks import rank_and_world
from rankwise.tools.watch.records import RankRecord

if TYPE_CHECKING:
    from rankwise.tools.watch.watcher_view import WatcherView


def of(watcher: WatcherView) -> RankRecord:
    """What the rank of ``watcher`` (a :class:`~rankwise.tools.watch.watcher.Watcher`) saw."""
    rank, world = watcher.calls.joined or watcher.calls.left or rank_and_world()
    return {
        "rank": rank,
        "world_size": world,
        "steps": watcher.step,
        "passes": watcher.data.records(),
        "set_epoch_calls": watcher.data.set_epoch_calls,
        "collectives": watcher.calls.records(),
        "reads": watcher.calls.read_records(),
        "metrics": watcher.calls.metrics.records(),
        "device": watcher.facts["device"],
        "saves": watcher.saves.saves,
        "replicas_differ": watcher.step_watch.replicas_differ,
        "summed_loss": watcher.step_watch.summed_loss,
        "unscaled": watcher.data.unscaled,
        "step_seconds": [round(s, 6) for s in watcher.window.step_seconds],
        "step_collective_seconds": [round(s, 6) for s in watcher.window.step_collective_seconds],
        "scale": watcher.settings.scale,
        "dropout": watcher.facts["dropout"],
        "framework_world_size": framework_world_size(),
        "api": watcher.facts["api"],
        "window_steps": watcher.window.end,
        "keep_batches": watcher.data.keep,
        "first_inputs": watcher.step_watch.first_inputs,
        "ended_by": watcher.ended_by,
        "destroyed_group": watcher.calls.destroyed_group,
    }


def write(watcher: WatcherView) -> None:
    record = of(watcher)
    path = watcher.settings.directory / RANK_RECORD.format(rank=record["rank"])
    write_text_atomic(path, json.dumps(record, indent=2, default=_plain))


def _plain(value: object) -> object:
    """A value the script handed torch as numpy's (a sampler's numpy indices: fabric's k-fold
    example), as Python's."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
