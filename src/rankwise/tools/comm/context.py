"""What every demo operation shares: the per-rank context, its known inputs, and the reference
reductions.

Each rank's input is a known function of its rank (:meth:`Ctx.value`), so every rank can
build every other rank's input locally and compute what an operation must return with
plain tensor arithmetic — the check does not trust the library it checks.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as torch_dist

ROOT = 0
"""The source / destination rank of the rooted operations (broadcast, scatter, gather, reduce)."""
VALUES = 4
"""Elements in each rank's demo tensor: small enough to read, enough to see the pattern."""
UNSUPPORTED = re.compile(
    r"does not support|not supported|unsupported (op|operation|reduce)|Cannot use ReduceOp|"
    r"requires NCCL",
    re.IGNORECASE,
)
"""What torch's backends say when they lack an operation (the call fails on every rank alike)."""
LACKING = (RuntimeError, ValueError)
"""What they raise then (ValueError for NCCL's "Cannot use ReduceOp.BAND with NCCL")."""


@dataclass
class Outcome:
    before: Any
    after: Any
    expected: Any
    """What ``after`` must be; ``None``: unspecified on this rank (not checked)."""


@dataclass
class Ctx:
    rank: int
    world_size: int
    device: torch.device
    backend: str
    composed: bool = False
    """Run each operation's composed equivalent instead of the native call."""
    how: str = field(default="native", init=False)
    """How the current operation ran: ``native`` or a description of its composition."""
    composed_run: bool = field(default=False, init=False)
    """Whether the current operation ran composed."""

    def value(
        self, rank: int, length: int = VALUES, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Rank ``rank``'s demo input (on the CPU): ``10·rank + 1 … 10·rank + length``, distinct on
        every rank."""
        return torch.arange(1, length + 1, dtype=dtype) + 10 * rank

    def on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone().to(self.device)

    def call(
        self, native: Callable[[], Any], composed: Callable[[], Any] | None = None, recipe: str = ""
    ) -> None:
        """Run ``native``; where the backend lacks it (or ``composed`` mode is on) run ``composed``
        and record how."""
        if self.composed and composed is not None:
            self.how = f"composed: {recipe}"
            self.composed_run = True
            composed()
            return
        try:
            native()
        except LACKING as e:
            if composed is None or not UNSUPPORTED.search(str(e)):
                raise
            self.how = (
                f"{self.backend} lacks it ({str(e).splitlines()[0][:80]}); composed: {recipe}"
            )
            self.composed_run = True
            composed()


@dataclass(frozen=True)
class Op:
    name: str
    what: str
    run: Callable[[Ctx], Outcome]


# -- reductions: the reference each ReduceOp must match -----------------------------------------

REDUCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "SUM": lambda stacked: stacked.sum(0),
    "PRODUCT": lambda stacked: stacked.prod(0),
    "MIN": lambda stacked: stacked.min(0).values,
    "MAX": lambda stacked: stacked.max(0).values,
    "AVG": lambda stacked: stacked.mean(0),
    "BAND": lambda stacked: functools.reduce(torch.bitwise_and, stacked),
    "BOR": lambda stacked: functools.reduce(torch.bitwise_or, stacked),
    "BXOR": lambda stacked: functools.reduce(torch.bitwise_xor, stacked),
}
BITWISE = ("BAND", "BOR", "BXOR")


def reduce_dtype(op: str) -> torch.dtype:
    return torch.int64 if op in BITWISE else torch.float32


def reference_reduce(op: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    return REDUCTIONS[op](torch.stack(tensors))


def everyone(
    c: Ctx, length: int = VALUES, dtype: torch.dtype = torch.float32
) -> list[torch.Tensor]:
    return [c.value(r, length, dtype) for r in range(c.world_size)]


def all_gather_list(c: Ctx, tensor: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(tensor) for _ in range(c.world_size)]
    torch_dist.all_gather(parts, tensor)
    return parts
