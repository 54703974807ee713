"""How the Runtime hands a rank its data: a loader over the rank's shard of each global batch, and
batches moved to the rank's device."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from rankwise.checkpoint.position import ResumableLoader
from rankwise.sampling.batching import check_enough_samples, dataset_size, rank_sampler

if TYPE_CHECKING:
    from rankwise.runtime import Runtime


@dataclass(frozen=True)
class Sampling:
    batch_size: int
    """The global batch: every rank's batches of one step together."""
    shuffle: bool
    """A training loader (a new order each epoch) or an evaluation one (every sample, in order)."""
    drop_last: bool
    """Drop the last incomplete global batch."""
    seed: int
    """The seed of the epochs' orders and of the loader's own generator."""


def shard_loader(
    rt: Runtime,
    dataset: Dataset[Any],
    sampling: Sampling,
    *,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    num_workers: int = 0,
    lengths: Sequence[int] | None = None,
    group_size: int | None = None,
    name: str = "rt.loader",
    prefetch: bool | None = None,
) -> ResumableLoader:
    """``rt.loader``'s loader: this rank's share of each global batch, resumable mid-epoch;
    ``prefetch`` (``None``: on a CUDA device) copies each batch to the device one batch ahead
    (``rt.prefetch``)."""
    if prefetch is None:
        prefetch = rt.device.type == "cuda"
    sampler = rank_sampler(
        dataset,
        sampling.batch_size,
        rt.world_size,
        rt.rank,
        shuffle=sampling.shuffle,
        drop_last=sampling.drop_last,
        seed=sampling.seed,
        lengths=lengths,
        group_size=group_size,
    )
    if sampling.drop_last:
        check_enough_samples(dataset_size(dataset), sampling.batch_size)
    # A private generator: iterating the loader must not consume the global RNG (dropout's),
    # or a resumed run would draw different dropout masks than an uninterrupted one.
    return ResumableLoader(
        dataset,
        batch_size=sampling.batch_size // rt.world_size,
        sampler=sampler,
        drop_last=sampling.drop_last,
        collate_fn=collate_fn,
        num_workers=num_workers,
        pin_memory=rt.device.type == "cuda",
        generator=torch.Generator().manual_seed(sampling.seed),
        gather=rt.all_gather_object,
        say=rt.print,
        world_size=rt.world_size,
        name=name,
        ahead=rt.prefetch.ahead if prefetch else None,
    )


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``batch`` with ``fn`` applied to each of its tensors (nested in dicts, lists and tuples)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(v, fn) for v in batch)
    return batch
