"""Lockstep: the trace a traced N-rank run writes, step by step, and the one-process reference that
follows it.

The N-rank run's rank 0 writes step 0's weights, each step's whole gradient (before the step), its
whole weights (after it), every rank's step record (``trace.jsonl``) and the run's facts.  A
following run (``follow``: the N-rank run's directory) starts from the N-rank run's step-0 weights,
steps with the N-rank gradient, keeps its own gradient's difference from it, and starts each next
step from the N-rank weights, so rounding never compounds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from rankwise.checkpoint import read_weights, write_text_atomic, write_weights
from rankwise.measure.tolerance import gradient_difference
from rankwise.tools.step_trace import (
    FACTS_FILE,
    TRACE_FILE,
    StepRecord,
    exchange_gradients,
    weights_file,
)
from rankwise.tools.watch.ranks import assign, rank_and_world, whole
from rankwise.tools.watch.records import WatchedFacts


class Lockstep:
    def __init__(self, directory: Path, follow: Path | None):
        self.directory = directory
        self.follow = follow
        """The N-rank run's directory while this run follows it (``None``: the N-rank run itself, or
        it ended)."""

    def start(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Step 0: the first model's weights as the script built them (a collective for sharded
        ones); a following run starts from the N-rank run's."""
        weights = {name: whole(p) for name, p in named}
        if rank_and_world()[0] == 0:
            write_weights(weights, weights_file(self.directory, 0))
        if self.follow is not None and weights_file(self.follow, 0).exists():
            take(named, read_weights(weights_file(self.follow, 0)))

    def exchange(
        self, step: int, gradients: dict[str, torch.Tensor], record: StepRecord
    ) -> dict[str, torch.Tensor] | None:
        """The N-rank run writes its whole gradient of ``step``; a following run gets it back (to
        step with) and keeps its own gradient's difference from it in ``record``.  ``None`` where
        there is nothing to follow (any more)."""
        applied = exchange_gradients(
            self.directory, self.follow, step, gradients, rank_and_world()[0] == 0
        )
        # the N-rank run itself, or it ended before this step: from here on this run goes alone
        if applied is None:
            self.follow = None
            return None
        record.gradient = gradient_difference(applied, gradients)
        return applied

    def write(
        self,
        step: int,
        records: list[dict[str, Any]],
        weights: dict[str, torch.Tensor],
        facts: WatchedFacts,
    ) -> None:
        """Rank 0, after ``step``: its whole weights, every rank's record, the facts."""
        write_weights(weights, weights_file(self.directory, step))
        with open(self.directory / TRACE_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, "ranks": records}) + "\n")
        write_text_atomic(self.directory / FACTS_FILE, json.dumps(facts, indent=2))

    def weights_after(self, step: int) -> dict[str, torch.Tensor] | None:
        """The N-rank run's weights after ``step``, for a following run to start the next step
        from."""
        if self.follow is not None and weights_file(self.follow, step).exists():
            return read_weights(weights_file(self.follow, step))
        return None


def take(named: list[tuple[str, torch.Tensor]], theirs: dict[str, torch.Tensor]) -> None:
    """Each named parameter takes the N-rank run's weights (those it has)."""
    for name, parameter in named:
        if name in theirs:
            assign(parameter, theirs[name])
