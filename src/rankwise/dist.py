"""Collectives that are no-ops at world size 1 and loud when a process group is missing.

Every function here is safe to call from a single-process run.  In a run that *should*
be distributed (``WORLD_SIZE`` > 1 in the environment) but never joined a process
group, they raise :class:`MissingProcessGroupError` instead of silently returning this
rank's values: that is how the "each process trains alone" bug is caught.
"""

from __future__ import annotations

import os
from typing import Literal

import torch
import torch.distributed as torch_dist

from rankwise.errors import MissingProcessGroupError

ReduceOp = Literal["sum", "mean", "max", "min"]


def _expected_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def world_size() -> int:
    if torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_world_size()
    expected = _expected_world_size()
    if expected > 1:
        raise MissingProcessGroupError(
            f"WORLD_SIZE={expected} but this process (RANK={os.environ.get('RANK', '?')}) has not "
            "joined a process group; call rankwise.setup(...) (or "
            "torch.distributed.init_process_group) before collectives"
        )
    return 1


_cpu_group = None


def cpu_group():
    """A gloo group for small CPU-side control messages: the default group when it is gloo,
    otherwise (NCCL) a gloo group beside it, created on first use (a collective: every rank calls it
    together)."""
    global _cpu_group
    if torch_dist.get_backend() == "gloo":
        return None  # the default group
    if _cpu_group is None:
        _cpu_group = torch_dist.new_group(backend="gloo")
    return _cpu_group


def forget_groups() -> None:
    """Drop groups created here (the process group they belong to is being destroyed)."""
    global _cpu_group
    _cpu_group = None


def barrier() -> None:
    if world_size() > 1:
        torch_dist.barrier()


def all_reduce(tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
    """Reduce ``tensor`` in place across ranks and return it (``mean`` divides by the world
    size)."""
    n = world_size()
    if n == 1:
        return tensor
    torch_op = {
        "sum": torch_dist.ReduceOp.SUM,
        "mean": torch_dist.ReduceOp.SUM,
        "max": torch_dist.ReduceOp.MAX,
        "min": torch_dist.ReduceOp.MIN,
    }[op]
    torch_dist.all_reduce(tensor, op=torch_op)
    if op == "mean":
        tensor /= n
    return tensor


def broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    if world_size() > 1:
        torch_dist.broadcast(tensor, src=src)
    return tensor


def broadcast_object(obj, src: int = 0):
    if world_size() == 1:
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj) -> list:
    """Every rank's picklable ``obj``, in rank order."""
    n = world_size()
    if n == 1:
        return [obj]
    out = [None] * n
    torch_dist.all_gather_object(out, obj)
    return out


def all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0, in rank order; first dims may differ between
    ranks."""
    n = world_size()
    if n == 1:
        return tensor
    # Why: all_gather needs equal shapes, so ranks first agree on each one's length, then pad to the
    # longest.
    local_len = torch.tensor([tensor.shape[0]], device=tensor.device)
    gathered = [torch.zeros_like(local_len) for _ in range(n)]
    torch_dist.all_gather(gathered, local_len)
    lengths = [int(x.item()) for x in gathered]
    longest = max(lengths)
    padded = tensor
    if tensor.shape[0] < longest:
        pad = tensor.new_zeros((longest - tensor.shape[0], *tensor.shape[1:]))
        padded = torch.cat([tensor, pad])
    parts = [torch.empty_like(padded) for _ in range(n)]
    torch_dist.all_gather(parts, padded.contiguous())
    return torch.cat([part[:length] for part, length in zip(parts, lengths)])


def gather_exact(
    index: torch.Tensor, *tensors: torch.Tensor, total: int
) -> tuple[torch.Tensor, ...]:
    """Gather per-sample tensors from all ranks, one row per sample, ordered by sample index.

    ``DistributedSampler`` pads the last shard by repeating samples so every rank gets the
    same count; the padded copies carry an index already seen and are dropped here.  The
    result has exactly ``total`` rows, or a ``RuntimeError`` says which samples are missing.
    """
    return exactly_once(all_gather(index), *(all_gather(t) for t in tensors), total=total)


def exactly_once(
    index: torch.Tensor, *tensors: torch.Tensor, total: int
) -> tuple[torch.Tensor, ...]:
    """Rows of already gathered per-sample tensors, one per distinct sample index, in index order;
    a ``RuntimeError`` unless there are exactly ``total`` distinct samples."""
    order = torch.argsort(index, stable=True)
    sorted_index = index[order]
    keep = torch.ones_like(sorted_index, dtype=torch.bool)
    keep[1:] = sorted_index[1:] != sorted_index[:-1]
    unique_index = sorted_index[keep]
    if unique_index.numel() != total:
        seen = set(unique_index.tolist())
        missing = [i for i in range(total) if i not in seen][:10]
        raise RuntimeError(
            f"exact gather found {unique_index.numel()} distinct samples, expected {total}; "
            f"missing e.g. {missing}"
        )
    return (unique_index, *(t[order][keep] for t in tensors))


class ExactGather:
    """Per-sample outputs of a sharded evaluation: kept on this rank batch by batch, gathered once
    at the end.

    ``add(index, *tensors)`` takes one batch's sample indices and per-sample rows;
    ``result()`` returns ``(index, *tensors)`` on every rank with each of the ``total``
    samples exactly once, in index order (the sampler's padding repeats dropped).
    """

    def __init__(self, total: int, columns: int = 3):
        self.total = total
        self.columns = columns
        """Tensors per ``add`` call, the index included (what an empty rank contributes)."""
        self.parts: list[tuple[torch.Tensor, ...]] = []

    def add(self, index: torch.Tensor, *tensors: torch.Tensor) -> None:
        self.parts.append((index, *tensors))

    def local(self) -> tuple[torch.Tensor, ...]:
        if not self.parts:  # an empty evaluation set: the rank still joins the gather
            return tuple(torch.empty(0, dtype=torch.long) for _ in range(self.columns))
        return tuple(torch.cat(column) for column in zip(*self.parts))

    def result(self) -> tuple[torch.Tensor, ...]:
        # Why: the only synchronisation of evaluation: one gather of every rank's rows.
        return gather_exact(*self.local(), total=self.total)
