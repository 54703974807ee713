"""Whether the ranks trained on their own shares: checked once, at the first optimizer step.

A script that iterates a plain ``DataLoader`` (no rank sampler) trains every rank on the same
batches: the run goes N times slower through the data and computes nothing a single process would
not, without a word. The Runtime keeps one digest per sample of the batches of the first step that
go through ``rt.to_device`` with gradients on; at the first ``rt.step`` the ranks compare them (one
small all-gather, once), and when every rank saw the very same samples rank 0 warns with the fix.
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist

from rankwise import dist
from rankwise.logs import get_logger
from rankwise.sampling.samples import sample_digests

log = get_logger(__name__)


class DataSharesCheck:
    def __init__(self, world_size: int):
        # (Horovod's ranks join no torch process group: its DistributedSampler is the user's own
        # anyway)
        self.pending = world_size > 1 and torch_dist.is_available() and torch_dist.is_initialized()
        """Still to be decided (only once, and only with several ranks)."""
        self.samples: list[str] = []

    def batch(self, batch) -> None:
        if self.pending and torch.is_grad_enabled():
            self.samples.extend(sample_digests(batch))

    def stepped(self) -> bool | None:
        """At the first step (every rank): whether every rank trained on the same samples (``None``:
        nothing to compare, the batches did not go through rt.to_device); rank 0 warns when they
        did."""
        if not self.pending:
            return None
        self.pending = False
        # Why: once per run, a few bytes per sample: the ranks' samples of step 1 side by side.
        seen = dist.all_gather_object(sorted(self.samples))
        self.samples = []
        if not seen[0]:
            return None
        same = all(rank == seen[0] for rank in seen[1:])
        if same:
            log.warning(
                "rankwise: all %d ranks trained on the same %d samples in the first step: the "
                "data loader is not rank-sharded, so every rank repeats the others' work. Build "
                "it with rt.loader(dataset, batch_size=GLOBAL_BATCH), which gives each rank its "
                "own share.",
                len(seen),
                len(seen[0]),
            )
        return same
