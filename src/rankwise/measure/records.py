"""The step-time breakdown's records (:mod:`rankwise.measure.breakdown`): what a run's summary holds
as its ``breakdown`` (``rankwise train --json``:
:meth:`rankwise.train.profiling.LoopProfile.breakdown`; a ``bench --script`` row:
:mod:`rankwise.tools.watch.window`), and what ``rankwise bench`` reads back from a row's run
(:mod:`rankwise.tools.bench.why`, ``--explain``, ``report.json``).  JSON is the wire format: the
``steps`` pair comes back as a list.
"""

from __future__ import annotations

from typing import TypedDict

from rankwise.measure.window_steps import WindowSteps


class RankParts(TypedDict):
    """One rank's profiled step split into its parts (:func:`~rankwise.measure.breakdown.combine`):
    milliseconds a step, averaged over the steps kept."""

    rank: int
    step_ms: float
    """The rank's mean profiled step."""
    parts_ms: dict[str, float]
    """Each of :data:`~rankwise.measure.breakdown.PARTS` (``forward``, ``backward``,
    ``optimizer``: compute; ``comm``: communication compute did not hide; ``data``: waiting for the
    next batch; ``sync``: host syncs; ``straggler``: waiting for the slowest rank; ``other``: the
    rest of the step); they add up to ``step_ms``."""
    late_ms: float
    """How long after the first rank it arrived at the gradient exchange (0 where the ranks'
    arrivals were not all seen)."""
    sync_ms: dict[str, float]
    """Each host sync's site (``barrier at train.py:9``) and its milliseconds a step."""
    loader: str | None
    """The class of the DataLoader iterator its batches came from
    (``_SingleProcessDataLoaderIter``: built in the training process), or None where no wait for
    a batch was seen."""
    steps: int
    """Steps every rank profiled."""
    steps_kept: int
    """Of those, the steps averaged: a step a busy machine paused is left out
    (:func:`~rankwise.measure.window_steps.paused`)."""
    last_in: int
    """Kept steps in which this rank arrived last at the gradient exchange, later than the first
    by more than :data:`~rankwise.measure.breakdown.LATE_S`."""


class DdpFacts(TypedDict):
    """A DDP model's gradient buckets, from DDP's own logging data (its private API: best
    effort)."""

    buckets: int
    """All-reduces a step: the buckets DDP built (rebuilt after the first step)."""
    bucket_cap_mb: float
    """Its ``bucket_cap_mb``."""
    parameter_mb: float
    """The model's parameters, MB: what its gradients exchange."""
    comm_hook: str | None
    """The communication hook registered on it (bf16 compression...), or None."""


class ModelFacts(TypedDict, total=False):
    """What the explanation needs of the models a step ran
    (:func:`~rankwise.measure.breakdown.model_facts`); a key only where the model has it."""

    ddp: DdpFacts
    """Where a model is a ``DistributedDataParallel``."""
    fsdp_units: int
    """Where a model holds FSDP units: how many."""


class Breakdown(TypedDict):
    """A run's step-time breakdown: every rank's profiled steps in parts, and the timed window
    beside them (``None`` in a summary where no step was profiled)."""

    steps: list[int]
    """The first and last step profiled (1-based): ``[first, last]``."""
    ranks: list[RankParts]
    """Every rank's parts, rank by rank."""
    device: str
    """The device type the steps ran on (``cpu``, ``cuda``: there the times are the host's)."""
    window_step_ms: float | None
    """The timed window's mean step (milliseconds), which the profiled steps are compared with;
    None where the window timed nothing."""
    window: WindowSteps | None
    """The timed window's every step, every rank's (:func:`~rankwise.measure.window_steps.summary`);
    None without a step timed on every rank."""
    facts: ModelFacts
    """The models' gradient exchange (DDP's buckets, FSDP's units)."""
