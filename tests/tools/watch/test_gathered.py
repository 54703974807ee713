"""What a script cuts off the tensors Accelerate's ``gather`` returned (the repeats of an
evaluation's last batch, dropped by hand)."""

from __future__ import annotations

from collections import namedtuple

import torch

from rankwise.tools.watch import gathered
from rankwise.tools.watch.gathered import Gathered, GatherWatch


def _gather(watch: GatherWatch, monkeypatch, world: int = 2):
    monkeypatch.setattr(gathered, "rank_and_world", lambda: (0, world))
    return watch.patched(lambda value: value)


def test_a_prefix_slice_of_a_gathered_batch_counts_the_rows_it_cut_once_per_call(monkeypatch):
    watch = GatherWatch()
    gather = _gather(watch, monkeypatch)
    # Accelerate's multi_process_metrics example: 64 rows gathered, 24 of them kept
    predictions, references = gather((torch.zeros(64, dtype=torch.long), torch.ones(64)))
    kept_p, kept_r = predictions[:24], references[:24]
    assert watch.trimmed == 40  # predictions and references cut alike: the call's rows once
    assert type(kept_p) is torch.Tensor and type(kept_r) is torch.Tensor  # handed on plain
    assert type(predictions + 1) is torch.Tensor and kept_p.shape == (24,)
    later = gather(torch.zeros(64, 3))
    later[:60, ...]
    assert watch.trimmed == 44


def test_other_indexing_is_not_a_cut(monkeypatch):
    watch = GatherWatch()
    tensor = _gather(watch, monkeypatch)(torch.arange(10.0))
    tensor[2:], tensor[::2], tensor[tensor > 3], tensor[3], tensor[:]
    assert watch.trimmed == 0


def test_structures_are_marked_through_and_one_rank_marks_nothing(monkeypatch):
    Pair = namedtuple("Pair", "a b")
    watch = GatherWatch()
    result = _gather(watch, monkeypatch)({"x": [torch.zeros(4)], "y": Pair(torch.zeros(4), 3)})
    assert type(result["x"][0]) is Gathered and isinstance(result["y"], Pair)
    assert type(result["y"].a) is Gathered and result["y"].b == 3
    alone = _gather(GatherWatch(), monkeypatch, world=1)(torch.zeros(4))
    assert type(alone) is torch.Tensor
