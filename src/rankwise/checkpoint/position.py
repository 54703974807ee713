"""Where a loader made by ``rt.loader`` stands in its data, so that a checkpoint taken mid-epoch
resumes after the last batch the loop was handed: at any world size, whatever epoch the loop
restarts, with a record that says so.

rankwise's samplers stride one global order per epoch across the ranks, and the global batch is the
same at every world size, so a rank's k-th batch is always part of the order's k-th global batch.  A
position is therefore one number valid at any world size: how many samples of the epoch's order the
batches handed out so far cover.

* ``rt.save_state`` records each loader's :meth:`ResumableLoader.position`: epoch, position, and
  digests of the epoch's order and of the samples before the position.
* ``rt.load_state`` hands it back (:meth:`ResumableLoader.resume`): this run's order must be the
  checkpoint's (same data, seed, global batch and length grouping), else it refuses; the sampler
  then passes over the samples already trained without loading them
  (:class:`rankwise.sampling.batching.ShardSampler`).
* At the first ``rt.step`` after it, the ranks gather the samples the resumed loader handed out and
  compare them with the order's next ones (:meth:`ResumableLoader.check_first_step`).  Rank 0 prints
  the record; a loop that passed over batches of its own (the skip it needed before this) is stopped
  with the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader

from rankwise.errors import ConfigError
from rankwise.sampling.batching import ShardSampler, epoch_order, global_order, order_digest


@dataclass
class Resumed:
    """A resume whose first step is still to come."""

    recorded: dict
    """The checkpoint's position (:meth:`ResumableLoader.position`, plus ``strategy`` and
    ``world_size``)."""
    handed: list[list[int]] = field(default_factory=list)
    """This rank's indices of each batch handed out since the resume."""


class ResumableLoader(DataLoader):
    """``rt.loader``'s DataLoader: it knows how far into its epoch the loop is, for
    ``rt.save_state``, and continues from there after ``rt.load_state``.  ``gather``: every rank's
    object (the Runtime's ``all_gather_object``); ``say``: how rank 0 prints; ``name``: how messages
    call it; ``ahead``: what the batches pass through before they are handed out (the Runtime's
    device prefetch, which takes one batch ahead: the count here is of batches handed out, so a
    batch taken ahead is not in the position)."""

    sampler: ShardSampler  # checked in __init__
    batch_size: int  # a ResumableLoader batches (rt.loader passes one)

    def __init__(
        self,
        *args,
        gather,
        say,
        world_size: int,
        name: str = "rt.loader",
        ahead: Callable[[Iterable[Any]], Iterator[Any]] | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.ahead = ahead
        if not isinstance(self.sampler, ShardSampler):
            raise TypeError(
                "a ResumableLoader needs rankwise's ShardSampler "
                "(rankwise.sampling.batching.rank_sampler)"
            )
        self._gather, self._world, self._name = gather, world_size, name
        self.say = say
        self._epoch = self.sampler.epoch
        self._handed = 0
        """Samples of the epoch's global order handed to the loop in the pass under way (or the last
        one)."""
        self._finished = False
        """Whether that pass ran to its end (the loop's ``for`` over it finished)."""
        self.resumed: Resumed | None = None
        self.continuity: dict | None = None
        """The record of the last resume, once its first step was checked."""

    @property
    def global_micro_batch(self) -> int:
        return self.batch_size * self._world

    def __iter__(self):
        sampler = self.sampler
        self._epoch, self._handed, self._finished = (
            sampler.epoch,
            sampler.start * self._world,
            False,
        )
        batches = super().__iter__()
        for k, batch in enumerate(batches if self.ahead is None else self.ahead(batches)):
            # Counted as it is handed out: a batch the loop received is trained (or deliberately
            # passed over).
            self._handed += self.global_micro_batch
            if self.resumed is not None:
                self.resumed.handed.append(
                    sampler.pass_indices[k * self.batch_size : (k + 1) * self.batch_size]
                )
            yield batch
        self._finished = True

    # -- the position a checkpoint records -------------------------------------------------
    def _epoch_order(self, epoch: int) -> list[int]:
        """The samples a pass of ``epoch`` hands out, in the global order (whole batches only)."""
        whole = (
            self.sampler.num_samples // self.batch_size * self.global_micro_batch
            if self.drop_last
            else None
        )
        return epoch_order(self.sampler, epoch, whole)

    def position(self) -> dict:
        """Where the loop stands: the epoch of the pass under way (or the last), the samples of its
        order handed out, and digests of that order and of the samples before the position."""
        epoch, handed, finished = self._epoch, self._handed, self._finished
        # resumed, its pass not begun: still where the checkpoint stood
        if self.sampler.pending is not None:
            epoch, handed, _ = self.sampler.pending
            finished = False
        order = self._epoch_order(epoch)
        handed = min(handed, len(order))
        return {
            "epoch": epoch,
            "position": handed,
            "epoch_samples": len(order),
            "order": order_digest(order),
            "consumed": order_digest(sorted(order[:handed])),
            "global_micro_batch": self.global_micro_batch,
            "finished": finished,
        }

    # -- a resume ----------------------------------------------------------------------------
    def resume(self, recorded: dict, step_samples: int) -> None:
        """Continue after ``recorded`` (a checkpoint's :meth:`position`); ``step_samples``: the
        samples of one optimizer step (global batch), to tell a finished epoch from one with a step
        left."""
        if recorded.get("finished") and not self.sampler.shuffle:
            # An unshuffled loader (an evaluation set, say) whose last pass ran to its end: the next
            # pass starts whole, as it would have.  (A shuffled one at the end of its epoch
            # continues as any other position.)
            return
        epoch, position = recorded["epoch"], recorded["position"]
        order = self._epoch_order(epoch)
        mine = {
            "epoch_samples": len(order),
            "order": order_digest(order),
            "consumed": order_digest(sorted(order[:position])),
        }
        differs = [key for key in mine if mine[key] != recorded[key]]
        if differs:
            raise ConfigError(
                f"{self._name}: the checkpoint stood at sample {position} of epoch {epoch} in an "
                f"order this run's loader does not have ({', '.join(differs)} differ: the "
                f"checkpoint's epoch has {recorded['epoch_samples']} samples, this run's "
                f"{len(order)}). The dataset, the seed, the global batch or the length grouping "
                "changed since it was written: build the loader as that run did, or load the "
                "checkpoint's weights alone (rt.load_weights) to start the data from its beginning"
            )
        if position % self._world:
            raise ConfigError(
                f"{self._name}: the checkpoint stood at sample {position} of its epoch, which "
                f"{self._world} ranks cannot split (save at an optimizer step)"
            )
        at_end = len(order) - position < step_samples
        self.sampler.resume_at(epoch, position, at_end)
        self.resumed = Resumed(recorded)

    def check_first_step(self, grad_accum: int, strategy: str) -> None:
        """At the first optimizer step after a resume (every rank, a collective): did the ranks
        train the order's next samples?  Prints the record on rank 0; stops a loop that passed over
        batches itself."""
        resumed, self.resumed = self.resumed, None
        assert resumed is not None  # the Runtime calls this only while a resume is pending
        # Why: the ranks' shares together are the step's global batch.
        everyone = self._gather(resumed.handed)
        recorded = resumed.recorded
        sampler = self.sampler
        handed = max(len(share) for share in everyone)
        cut = recorded["position"] if sampler.epoch == recorded["epoch"] else 0
        if not handed:
            return  # not iterated before the step (a loader for evaluation): nothing to check
        if handed > grad_accum:
            raise RuntimeError(
                f"{self._name} continued the checkpoint's epoch {recorded['epoch']} at sample "
                f"{cut} (rt.load_state restores where it was), but the loop took {handed} batches "
                f"before its first step, where a step takes {grad_accum}: it passed over "
                f"{handed - grad_accum} itself, which this run would then never train. Remove the "
                "loop's own skip of the steps already done (or declare rt.prepare(..., "
                "grad_accum=N) if the loop accumulates N micro-batches)"
            )
        trained = [index for share in everyone for batch in share for index in batch]
        expected = global_order(sampler)[cut : cut + len(trained)]
        record = {
            "epoch": sampler.epoch,
            "position": cut,
            "epoch_samples": recorded["epoch_samples"],
            "written": {
                "strategy": recorded.get("strategy"),
                "world_size": recorded.get("world_size"),
            },
            "resumed": {"strategy": strategy, "world_size": self._world},
            "loop_epoch": sampler.overruled,
            "trained": len(trained),
            "distinct": len(set(trained)),
            "continuous": sorted(trained) == sorted(expected) and len(set(trained)) == len(trained),
        }
        self.continuity = record
        if self.say is not None:
            self.say(describe(record, self._name))
        if not record["continuous"]:
            raise RuntimeError(
                f"{self._name}: the first step after the resume did not train the order's next "
                f"{len(expected)} samples (it trained {len(trained)}, {len(set(trained))} distinct)"
            )


def describe(record: dict, name: str = "rt.loader") -> str:
    """A resume's record as rank 0 prints it."""
    written, resumed = record["written"], record["resumed"]
    lines = [
        f"continuity: {name} resumed epoch {record['epoch']} at sample {record['position']} of "
        f"{record['epoch_samples']} in its order ({written['strategy']} x{written['world_size']} "
        f"-> {resumed['strategy']} x{resumed['world_size']})"
    ]
    if record["loop_epoch"] is not None:
        lines.append(
            f"  the loop set epoch {record['loop_epoch']}; the checkpoint's position wins, so the "
            "loop's epoch count is off from here (restart the loop at load_state's extra epoch)"
        )
    lines.append(
        f"  before the cut: the order's first {record['position']} samples (digest matches the "
        "checkpoint)"
    )
    verdict = "the order's next ones" if record["continuous"] else "NOT the order's next ones"
    lines.append(
        f"  first step: the ranks trained {record['trained']} samples ({record['distinct']} "
        f"distinct) = {verdict}"
    )
    lines.append(
        "  no sample skipped, none repeated" if record["continuous"] else "  NOT CONTINUOUS"
    )
    return "\n".join(lines)
