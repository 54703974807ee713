"""``rankwise plan``'s row as ``plan.json`` writes it (:func:`rankwise.tools.plan.report.row_json`):
one strategy at one world size, from the :class:`~rankwise.tools.plan.planner.Row` dataclass the
planner computes.  JSON is the wire format; the fields mirror the dataclasses' (their docstrings say
more)."""

from __future__ import annotations

from typing import TypedDict


class MemoryJSON(TypedDict):
    """One rank's memory, in bytes (:class:`rankwise.tools.plan.rank_memory.Memory`)."""

    parameters: int
    """Parameters the rank keeps (its shard, or all of them)."""
    gradients: int
    """Gradients the rank keeps once its backward pass is done."""
    optimizer: int
    """Optimizer state the rank keeps (moments, fp32 master weights)."""
    activations: int
    """Activations, temporaries, the batch and module buffers at the step's peak."""
    buffers: int
    """The strategy's communication buffers and gathered parameters at the peak."""
    peak: int
    """The step's peak: the sum of ``at_peak``."""
    at_peak: dict[str, int]
    """Every kind of memory at the peak (:data:`rankwise.tools.plan.rank_memory.KINDS`)."""
    source: str
    """How the numbers were obtained (a formula and its source, or a measurement)."""
    notes: list[str]
    """Caveats for this row."""


class CollectiveJSON(TypedDict):
    """One kind of collective a step makes (:class:`rankwise.tools.plan.comms.Collective`)."""

    op: str
    """``all_reduce``, ``all_gather`` or ``reduce_scatter``."""
    nbytes: int
    """Bytes per step, summed over its calls."""
    calls: int
    """Calls per optimizer step."""
    overlapped: str
    """The pass it runs beside (``forward``, ``backward``), or ``""``: nothing hides it."""
    what: str
    """What it carries."""


class StepTimeJSON(TypedDict):
    """One optimizer step's time per rank, in seconds
    (:class:`rankwise.tools.plan.timing.StepTime`)."""

    compute_s: float
    """Seconds of the forward and backward passes (every micro-batch of the step)."""
    optimizer_s: float
    """Seconds of the optimizer's update."""
    comm_s: float
    """Seconds of all the step's collectives, end to end, hidden or not."""
    exposed_comm_s: float
    """The seconds of ``comm_s`` no computation hides."""
    flops: int
    """FLOPs one rank computes in the step."""
    efficiency: float
    """Achieved share of the device's peak while computing (FLOPs / peak / ``compute_s``)."""
    overlap: str
    """Which collectives hide behind which pass, in words."""
    total_s: float
    """The step: ``compute_s + optimizer_s + exposed_comm_s``."""
    noise: float
    """The share of ``total_s`` its timing's spread could move it by (0 where it was not timed)."""


class PlanRowJSON(TypedDict):
    """One strategy at one world size (``plan.json``'s ``rows``)."""

    strategy: str
    """The strategy's registered name."""
    world_size: int
    """Ranks in the job."""
    rows: int
    """Samples per rank per micro-batch."""
    precision: str
    """The precision planned (``32-true``, ``bf16-mixed``, ``16-mixed``)."""
    checkpointing: bool
    """Whether the layers recompute their activations in the backward pass."""
    fits: bool
    """Whether the peak stays under the device's memory less the headroom."""
    change: str
    """For a row that does not fit: the cheapest change that makes it fit (empty when it fits, or
    none does)."""
    memory: MemoryJSON
    """One rank's memory."""
    collectives: list[CollectiveJSON]
    """What the strategy communicates per optimizer step."""
    time: StepTimeJSON
    """One optimizer step's time per rank."""
