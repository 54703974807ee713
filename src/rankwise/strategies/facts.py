"""What a strategy *is*, declared in its own file: what a rank holds 1/N of, the collectives one
optimizer step makes, how its memory is laid out, and where ``rankwise bench`` shows it.

``rankwise plan`` and ``rankwise bench`` read these from the registry
(:func:`rankwise.strategies.facts_of`) and name no strategy themselves, so a new strategy file is
planned and benched with nothing else edited.  A variant (``deepspeed-zero2``) declares its own,
where its fixed settings change them; otherwise it has its strategy class's.

The facts are data, not code: the plan (a tool, a layer above the strategies) turns them into bytes
and seconds with its measured trace of the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["optimizer", "gradients", "parameters"]
"""The training state a strategy may split over its ranks."""

Carries = Literal[
    "gradients",
    "parameters",
    "layer-parameters",
    "partitioned-parameters",
    "persistent-parameters",
    "norm",
]
"""What a collective moves: every gradient, every parameter, the parameters of the wrapped layers
(not the root's), the parameters partitioned away (ZeRO-3: those above its persistence threshold),
those kept whole on every rank (below it), or one fp32 number (a norm)."""

Count = Literal[
    "buckets",
    "units",
    "layer-units",
    "parameter-groups",
    "element-buckets",
    "each",
    "one",
    "zero3-fetches",
    "zero3-sub-groups",
]
"""How many calls it makes: one per bucket of :attr:`StepCall.bucket` bytes of what it carries, one
per wrapped unit (the layers and the root), one per wrapped layer, one per optimizer parameter
group, one per bucket of :attr:`StepCall.bucket` parameter elements, one per tensor it carries, one,
as DeepSpeed ZeRO-3's coordinator fetches and prefetches over the module calls of its pass (and
only what it gathers again: ``rankwise.tools.plan.zero3_fetch``), or one per ZeRO-3 optimizer
sub-group (:attr:`StepCall.bucket` elements of the rank's partitions)."""

Layout = Literal[
    "whole",
    "reducer-buckets",
    "fusion-buffer",
    "flat-partitions",
    "parameter-partitions",
    "measured",
]
"""How a rank's memory is laid out, for the plan's formula of it (``tools/plan/rank_memory.py``):
everything whole as one process has it; whole with the gradients in DDP's reducer buckets; whole
with a fusion buffer outside torch; one flat buffer partitioned over the ranks (ZeRO-1/2); each
parameter partitioned on its own (ZeRO-3); or measured on fake ranks (FSDP2, which fake tensors
reach)."""

Preset = Literal["smoke", "quick", "full", "opt-in"]
"""The smallest ``rankwise bench`` preset whose default rows include it (``opt-in``: only when
named)."""


@dataclass(frozen=True)
class StepCall:
    """One kind of collective an optimizer step makes."""

    op: Literal["all_reduce", "all_gather", "reduce_scatter"]
    carries: Carries
    count: Count
    beside: Literal["forward", "backward", ""]
    """The pass it runs beside (overlapping it), or ``""``: nothing hides it."""
    what: str
    """What it carries, in words, for the plan's reading."""
    every_micro_batch: bool = False
    """Made again for each micro-batch (a gather of parameters freed after use), not once a step."""
    half_at_mixed: bool = False
    """At a mixed precision it moves the 16-bit copy (FSDP2's ``param_dtype``), not the fp32 one."""
    bucket: int = 0
    """Bytes (``buckets``) or elements (``element-buckets``) a call moves at most."""
    when_clipping: bool = False
    """Made only in a step that clips the gradients' norm."""


@dataclass(frozen=True)
class BenchRow:
    """A row ``rankwise bench`` adds for a strategy: the strategy with some ``--set`` settings."""

    suffix: str
    """Appended to the strategy's name: ``+bf16`` gives ``ddp+bf16``."""
    settings: tuple[str, ...]
    about: str
    preset: Preset = "full"
    threads: int | None = None
    """Threads per process where not the fair share of the cores."""


@dataclass(frozen=True)
class Facts:
    shards: frozenset[Kind] = frozenset()
    """The state each rank holds 1/N of (empty: every rank holds all of it)."""
    step: tuple[StepCall, ...] = ()
    """The collectives one optimizer step makes at several ranks."""
    layout: Layout | None = "whole"
    """``None``: ``rankwise plan`` has no model of it (bench still runs it)."""
    casts_model: bool = False
    """At a mixed precision its engine casts the model to 16 bits (DeepSpeed); otherwise autocast
    runs over fp32 parameters."""
    planned: bool = True
    """In ``rankwise plan``'s default set (Accelerate, DDP underneath, and Horovod, whose buffer is
    outside torch, are planned only when named)."""
    bench: Preset = "quick"
    about: str = ""
    """One line for bench's table."""
    bench_rows: tuple[BenchRow, ...] = field(default_factory=tuple)

    def shards_more_than(self, other: Facts) -> bool:
        """Whether a rank holds strictly less of the state under this strategy than under
        ``other``: the change the plan proposes for a row that does not fit."""
        return self.shards > other.shards
