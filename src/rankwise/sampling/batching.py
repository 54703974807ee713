"""How a global batch splits across ranks and micro-batches, and a sampler that groups texts by
length.

The global batch is the same at every world size: each rank takes
``batch_size / (world_size x grad_accum)`` samples per micro-batch (:func:`micro_batch_size`).

:class:`LengthGroupedSampler` is a DistributedSampler whose global batches hold texts of similar
length.

Batches are padded to their longest text, so a batch of 32 random reviews (mean 42
BPE tokens, one in six cut at 96) costs as much as 32 texts of the longest one's length.
Grouping texts of similar length into the same batch (as Hugging Face's
``group_by_length`` does) roughly halves the work per epoch on the ``sentiment`` task.

The grouping never breaks the equivalence contract: the epoch's order is built on the
*global* sequence of samples, identically on every rank, and each rank then takes every
``num_replicas``-th index exactly like :class:`DistributedSampler`.  So the ranks'
batches of one optimizer step are together exactly one batch of a single-process run
with the same seed and global batch, whatever the world size or accumulation.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler

from rankwise.errors import ConfigError


def micro_batch_size(batch_size: int, world_size: int, grad_accum: int = 1) -> int:
    """Per-rank micro-batch of a global batch; refuses a batch that does not split evenly."""
    per_step = world_size * grad_accum
    if batch_size % per_step:
        raise ConfigError(
            f"batch_size={batch_size} is not divisible by world_size ({world_size}) x grad_accum "
            f"({grad_accum}) = {per_step}; the global batch must split evenly across ranks and "
            "micro-batches"
        )
    return batch_size // per_step


def check_enough_samples(samples: int, batch_size: int, what: str = "the training data") -> None:
    """Refuse data that does not fill one global batch (a training loader drops incomplete ones)."""
    if samples < batch_size:
        raise ConfigError(
            f"{what} has {samples} samples, fewer than one global batch ({batch_size}); lower "
            "--batch-size"
        )


class SizedIterable(Protocol):
    """What :func:`iterate_steps` reads: a loader that knows its length and yields batches."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...


def dataset_size(dataset: Dataset) -> int:
    """The samples a map-style dataset holds.  torch's ``Dataset`` declares no ``__len__``; every
    dataset a DistributedSampler shards has one (the sampler reads it too)."""
    return len(dataset)  # type: ignore[arg-type]  # reason: Dataset declares no __len__ (see above)


def iterate_steps(loader: SizedIterable, grad_accum: int):
    """Yield ``(micro_index, is_last_micro, batch)`` for whole optimizer steps only.

    Micro-batches left over at the end of an epoch (fewer than ``grad_accum``) are
    skipped, so every optimizer step averages the same number of samples.
    """
    steps = len(loader) // grad_accum
    for i, batch in enumerate(loader):
        if i >= steps * grad_accum:
            break
        yield i, (i + 1) % grad_accum == 0, batch


def rank_sampler(
    dataset: Dataset,
    batch_size: int,
    world_size: int,
    rank: int,
    *,
    shuffle: bool,
    drop_last: bool,
    seed: int,
    lengths: Sequence[int] | None = None,
    group_size: int | None = None,
) -> DistributedSampler:
    """This rank's sampler of a loader whose global batch is ``batch_size``: rank-strided, the same
    order at every world size; with ``lengths``, global batches of similar length (``group_size``:
    samples per group)."""
    if lengths is None:
        return ShardSampler(
            dataset,
            num_replicas=world_size,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
    if not (shuffle and drop_last):
        raise ValueError("lengths group a shuffled training loader (shuffle=True, drop_last=True)")
    group_size = group_size or batch_size
    if group_size % batch_size:
        raise ValueError(
            f"group_size {group_size} is not a multiple of the batch size {batch_size}"
        )
    return LengthGroupedSampler(
        dataset, lengths, group_size, num_replicas=world_size, rank=rank, seed=seed
    )


class ShardSampler(DistributedSampler):
    """A DistributedSampler that can begin a pass part-way through its epoch's order: after a resume
    (:mod:`rankwise.checkpoint.position`), it passes over the samples a checkpoint's run had already
    trained.

    ``resume_at(epoch, position, at_end)``: the next pass continues ``epoch`` after the first
    ``position`` samples of its global order (a multiple of the world size).  The loop's own
    ``set_epoch`` before that pass decides how: the same epoch continues it; the next one, when the
    checkpoint had finished its epoch, starts that one from its first sample; any other is overruled
    (the checkpoint's position wins) and recorded in ``overruled``.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start = 0
        """This rank's samples to pass over at the next pass (set by a resume, cleared when the pass
        begins)."""
        self.pending: tuple[int, int, bool] | None = None
        """(epoch, position, at_end) of a resume whose pass has not begun."""
        self.overruled: int | None = None
        """The epoch the loop asked for where the resume's position overruled it."""
        self.pass_indices: list[int] = []
        """This rank's indices of the pass under way, from its first (after a resume: the first not
        passed over)."""

    def resume_at(self, epoch: int, position: int, at_end: bool) -> None:
        self.pending = (epoch, position, at_end)
        self.overruled = None
        self._place(epoch)

    def set_epoch(self, epoch: int) -> None:
        if self.pending is None:
            super().set_epoch(epoch)
        else:
            self._place(epoch)

    def _place(self, asked: int) -> None:
        assert self.pending is not None  # resume_at and set_epoch call this with a resume pending
        epoch, position, at_end = self.pending
        # the loop restarts the checkpoint's epoch: continue it (all of it passed over at its end)
        if asked == epoch:
            super().set_epoch(epoch)
            self.start = position // self.num_replicas
        elif at_end and asked == epoch + 1:  # the loop moved on, as the checkpoint's run did
            super().set_epoch(asked)
            self.start = 0
        else:
            # another epoch: the checkpoint's position wins, so no sample is trained twice or
            # skipped
            self.overruled = asked
            super().set_epoch(epoch + 1 if at_end else epoch)
            self.start = 0 if at_end else position // self.num_replicas

    def _indices(self) -> list[int]:
        """This rank's indices of the whole epoch (DistributedSampler's)."""
        return list(super().__iter__())

    def __iter__(self) -> Iterator[int]:
        start, self.start, self.pending = self.start, 0, None
        self.pass_indices = self._indices()[start:]
        return iter(self.pass_indices)

    def __len__(self) -> int:
        return self.num_samples - self.start


class OrderedShardSampler(Sampler[int]):
    """This rank's share of a fixed evaluation order (longest text first, say): every
    ``num_replicas``-th index from ``rank``.  The last round is padded by repeating the order's
    start, as DistributedSampler pads, so every rank runs the same number of batches; the exact
    gather drops the repeats by index."""

    def __init__(self, order: Sequence[int], num_replicas: int, rank: int):
        order = list(order)
        total = -(-len(order) // num_replicas) * num_replicas
        padded = (order * (total // len(order) + 1))[:total] if order else []
        self.indices = padded[rank:total:num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def longest_first(lengths: Sequence[int]) -> list[int]:
    """Sample indices by length, longest first (ties in index order): batches cut from it pad
    little."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


GROUP_BATCHES = 32
"""Global batches per sorting window: large enough for homogeneous lengths, small enough to stay
random."""


class LengthGroupedSampler(ShardSampler):
    """Shuffled, length-grouped, rank-strided indices; drops the last incomplete global batch.

    Each epoch: a seeded permutation of all samples is cut into windows of
    ``GROUP_BATCHES`` global batches; each window is sorted by length (longest first) and
    cut into global batches of ``group_size``; the order of those batches is shuffled.
    """

    def __init__(
        self,
        dataset: Dataset,
        lengths: Sequence[int],
        group_size: int,
        *,
        num_replicas: int,
        rank: int,
        seed: int = 0,
    ):
        if len(lengths) != dataset_size(dataset):
            raise ValueError(
                f"{len(lengths)} lengths for a dataset of {dataset_size(dataset)} samples"
            )
        if group_size % num_replicas:
            raise ValueError(f"global batch {group_size} is not divisible by {num_replicas} ranks")
        super().__init__(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.long)
        self.group_size = group_size
        # Whole global batches only, so every step of every rank has a full share.
        self.total_size = dataset_size(dataset) // group_size * group_size
        self.num_samples = self.total_size // num_replicas

    def global_order(self) -> list[int]:
        """The epoch's sample order as a single process would see it (identical on every rank)."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=generator)[: self.total_size]
        window = self.group_size * GROUP_BATCHES
        batches = []
        for start in range(0, self.total_size, window):
            chunk = order[start : start + window]
            # Stable sort: equal lengths keep their random order.
            chunk = chunk[torch.sort(self.lengths[chunk], descending=True, stable=True).indices]
            batches.extend(chunk.split(self.group_size))
        shuffled = torch.randperm(len(batches), generator=generator).tolist()
        return torch.cat([batches[i] for i in shuffled]).tolist() if batches else []

    def _indices(self) -> list[int]:
        return self.global_order()[self.rank : self.total_size : self.num_replicas]


def global_order(sampler: DistributedSampler) -> list[int]:
    """The sample order of ``sampler``'s current epoch as one process sees it, the same at every
    world size: the ranks' k-th micro-batches together are its k-th run of ``world_size x
    micro-batch`` indices."""
    if isinstance(sampler, LengthGroupedSampler):
        return sampler.global_order()
    if not sampler.shuffle:
        return list(range(dataset_size(sampler.dataset)))
    # DistributedSampler's own draw
    generator = torch.Generator().manual_seed(sampler.seed + sampler.epoch)
    return torch.randperm(dataset_size(sampler.dataset), generator=generator).tolist()


def epoch_order(sampler: DistributedSampler, epoch: int, samples: int | None = None) -> list[int]:
    """The global order of ``sampler``'s ``epoch`` (its first ``samples``), leaving the sampler, and
    a resume it holds, as they are."""
    at = copy.copy(sampler)  # the loader's own sampler keeps the epoch it is iterating
    if isinstance(at, ShardSampler):
        at.pending = None  # a ShardSampler's resume would overrule the epoch asked for
    at.set_epoch(epoch)
    return global_order(at)[:samples]


def order_digest(indices: Sequence[int]) -> str:
    """A short fingerprint of a sequence of sample indices (its order counts)."""
    return hashlib.sha256(
        torch.as_tensor(list(indices), dtype=torch.int64).numpy().tobytes()
    ).hexdigest()[:16]
