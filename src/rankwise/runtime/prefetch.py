"""Each batch on its way to the device before the loop asks for it: ``rt.loader`` starts the copy of
the next batch when it hands one out, on a side CUDA stream, and ``rt.to_device`` takes the copy
made for the batch it is given.

The loader still hands out the host batches, so everything a loop does with them before
``rt.to_device`` (counting tokens, logging shapes) stays on the host and costs no device sync, and
the loader's position (what ``rt.save_state`` records) counts the batches handed out, never the one
being copied ahead: a resume is exactly where it would be without the prefetch.

A copy is used only for the very tensor it was made from, unchanged: the same tensor object at the
same count of in-place writes.  A tensor changed in place after the loader handed it out is copied
again, and rank 0 says so once; a new tensor (``batch["x"] = batch["x"] * 2``) is copied as it
would be without the prefetch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from rankwise.compat.private import TENSOR_VERSION
from rankwise.runtime.data import map_tensors
from rankwise.sampling.samples import batch_tensors


@dataclass
class _Copy:
    host: torch.Tensor
    """The tensor as the loader handed it out (kept alive: a pinned source must outlive its copy,
    and its ``id`` is its key)."""
    writes: int
    """Its count of in-place writes when the copy started."""
    moved: torch.Tensor
    """Its copy on the device, made on the side stream."""


class DeviceAhead:
    """Copies a loader's batches to ``device`` one batch ahead of the loop.

    ``ahead(batches)`` wraps a loader's iterator: before it yields a batch it takes the next one and
    starts copying its tensors, so the copy runs while the loop trains the batch before it.
    ``move(batch)`` is ``rt.to_device``: each tensor of ``batch`` copied ahead, unchanged since,
    comes from its copy; any other is copied now.  A copy is found by its tensor, so a batch taken
    apart and put together again (``x, y = rt.to_device((x, y))``) still finds it.  Copies are held
    for two batches at most: the one the loop has and the next one."""

    def __init__(self, device: torch.device, *, say: Callable[[str], None] | None = None) -> None:
        self.device = device
        self.say = say
        self._stream: torch.cuda.Stream | None = None
        self._copies: dict[int, _Copy] = {}
        self._in_flight: list[list[int]] = []
        """The keys of each batch's copies, oldest first."""
        self.taken = 0
        """Tensors ``move`` took from a copy made ahead."""
        self.copied_again = 0
        """Tensors changed in place after the loader handed them out: ``move`` copied them again."""

    def _start(self, batch: Any) -> None:
        if self._stream is None and self.device.type == "cuda":
            # A side stream: the copies overlap the computation queued on the current one.
            self._stream = torch.cuda.Stream(self.device)
        keys = []
        with torch.cuda.stream(self._stream) if self._stream else contextlib.nullcontext():
            for tensor in batch_tensors(batch):
                TENSOR_VERSION.check()
                moved = tensor.to(self.device, non_blocking=True)  # from pinned memory: async
                self._copies[id(tensor)] = _Copy(tensor, tensor._version, moved)
                keys.append(id(tensor))
        self._in_flight.append(keys)
        while len(self._in_flight) > 2:  # an earlier batch the loop never moved holds nothing
            for key in self._in_flight.pop(0):
                self._copies.pop(key, None)

    def ahead(self, batches: Iterable[Any]) -> Iterator[Any]:
        """``batches`` as they come, each yielded after the next one's copy has started."""
        iterator = iter(batches)
        try:
            current = next(iterator)
        except StopIteration:
            return
        self._start(current)
        try:
            for following in iterator:
                self._start(following)
                yield current
                current = following
            yield current
        finally:  # the pass ended or the loop left it: no copy outlives it
            self._copies.clear()
            self._in_flight.clear()

    def move(self, batch: Any) -> Any:
        """``batch``'s tensors (nested in dicts, lists and tuples) on the device: from the copies
        made ahead where there are some (each handed over once), else copied now."""
        waited = False

        def one(tensor: torch.Tensor) -> torch.Tensor:
            nonlocal waited
            copy = self._copies.pop(id(tensor), None)
            if copy is None or copy.host is not tensor:
                return tensor.to(self.device, non_blocking=True)
            if tensor._version != copy.writes:
                self._changed()
                return tensor.to(self.device, non_blocking=True)
            if self._stream is not None:
                current = torch.cuda.current_stream(self.device)
                if not waited:
                    # Why: the copy was queued on the side stream; the step must not read it
                    # before it lands.
                    current.wait_stream(self._stream)
                    waited = True
                # and the allocator must not reuse its memory while the current stream reads it
                copy.moved.record_stream(current)
            self.taken += 1
            return copy.moved

        return map_tensors(batch, one)

    def _changed(self) -> None:
        self.copied_again += 1
        if self.copied_again == 1 and self.say is not None:
            self.say(
                "rt.to_device: a batch was changed in place after rt.loader handed it out, so the "
                "copy made ahead for it was dropped and it was copied again (correct, but the "
                "prefetch is lost): change it after rt.to_device, or pass "
                "rt.loader(..., prefetch=False)"
            )
