"""torch: what ``rankwise plan`` measures FSDP2 with on fake ranks, from two private modules.

``FSDPMemTracker`` (``torch.distributed._tools.fsdp2_mem_tracker``) follows an FSDP2 step's memory
by kind (parameters, gradients, optimizer state, activations, buffers) on fake tensors;
``FakeStore`` (``torch.testing._internal.distributed.fake_pg``) lets a ``fake`` process group of N
ranks start in one process, so the shards are what N ranks hold.  Neither has a public home;
``tests/compat/test_private_apis.py`` resolves both on the installed torch, and the plan's FSDP
tests (``tests/tools/plan``) measure with them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import overload

import torch

from rankwise.compat.versions import Patch, Private

SEEN_ON = ("2.11", "2.13")

MEM_TRACKER = Private(
    "torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker",
    "torch",
    "an FSDP2 step's memory by kind on fake tensors (the plan's FSDP rows)",
    SEEN_ON,
)
FAKE_STORE = Private(
    "torch.testing._internal.distributed.fake_pg.FakeStore",
    "torch",
    "the store of a 'fake' process group: N ranks' shards in one process",
    SEEN_ON,
)


CHUNKS = Patch(
    "torch.distributed.fsdp._fully_shard._fsdp_param._chunk_with_empty",
    "torch",
    "FSDP2 cuts each parameter into one view per rank to keep its own (rank 0 on fake ranks) and "
    "read the padded size off the first; the plan's copy makes those two only, where torch makes "
    "all N (at 512 fake ranks, 447,000 fake views of Llama 3 8B: half the plan's time)",
    SEEN_ON,
)


class RankChunks(Sequence[torch.Tensor]):
    """``_chunk_with_empty(tensor, n, dim)`` as a sequence that makes a chunk when it is read: the
    same views ``torch.chunk`` gives (``narrow`` at multiples of ``ceil(size / n)``), then empty
    tensors up to ``n``."""

    def __init__(self, tensor: torch.Tensor, n: int, dim: int):
        self.tensor, self.n, self.dim = tensor, n, dim
        size = tensor.size(dim)
        self.step = math.ceil(size / n) if size else 0
        # torch.chunk gives one (empty) chunk of an empty dimension, else ceil(size / step)
        self.made = math.ceil(size / self.step) if size else 1

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, index: int) -> torch.Tensor: ...
    @overload
    def __getitem__(self, index: slice) -> list[torch.Tensor]: ...
    def __getitem__(self, index: int | slice) -> torch.Tensor | list[torch.Tensor]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.n))]
        if index < 0:
            index += self.n
        if not 0 <= index < self.n:
            raise IndexError(index)
        if index >= self.made:
            return self[0].new_empty(0)
        start = index * self.step
        length = min(self.step, self.tensor.size(self.dim) - start)
        return self.tensor.narrow(self.dim, start, length)


@contextlib.contextmanager
def chunks_when_read() -> Iterator[None]:
    """FSDP2's per-rank chunks made when read (:class:`RankChunks`), while the context lasts."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    CHUNKS.check()
    original = _fsdp_param._chunk_with_empty
    _fsdp_param._chunk_with_empty = RankChunks  # type: ignore[assignment]  # a sequence, not a list
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = original


def mem_tracker() -> type:
    """``FSDPMemTracker`` (imported when used: it imports FSDP's internals)."""
    MEM_TRACKER.check()
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    return FSDPMemTracker


def fake_store() -> type:
    """``FakeStore``."""
    FAKE_STORE.check()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore
