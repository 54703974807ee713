"""``rankwise comm bench``'s records: one measured case, the harness's own cost, a rank's sweep,
the analysis and the whole result (``comm.json``).  JSON is the wire format."""

from __future__ import annotations

from typing import Any, TypedDict

from typing_extensions import NotRequired


class CommRow(TypedDict):
    """One operation at one message size (the nccl-tests columns)."""

    op: str
    bytes: int
    """Message size (the nccl-tests convention: the larger buffer)."""
    count: int
    """Elements per rank."""
    dtype: str
    time_us: float
    """Median time of a call, the slowest rank's."""
    p90_us: float
    algbw_GBps: float
    """Bytes over time."""
    factor: float
    """Bus bytes per message byte for this operation at this world size."""
    busbw_GBps: float
    """algbw x factor: comparable across operations and world sizes."""
    wrong: int
    """Elements that came back wrong, summed over the ranks."""


class Harness(TypedDict):
    """The timing loop's own cost on a 4-byte all_reduce, against a bare loop."""

    harness_us: float
    bare_us: float
    overhead: float
    """The median of the paired ratios, less 1."""
    rounds: int
    iters: int
    ratios: list[float]


class Sweep(TypedDict):
    """What rank 0 measured: every operation at every size."""

    world_size: int
    backend: str
    device: str
    results: list[CommRow]
    harness: Harness
    nnodes: NotRequired[int]


class OpReading(TypedDict):
    peak_busbw_GBps: float
    large_busbw_GBps: float | None
    """The median over messages of 4 MiB and more."""
    large_vs_ceilings: dict[str, float]
    """That over each of the machine's ceilings."""


class BucketAdvice(TypedDict):
    """Which DDP ``bucket_cap_mb`` the all_reduce curve suggests."""

    peak_busbw_GBps: float
    knee_bytes: int | None
    default_fraction_of_peak: float | None
    first_bucket_fraction_of_peak: float | None
    text: NotRequired[str]
    suggested_bucket_cap_mb: NotRequired[int]


class Analysis(TypedDict):
    ops: dict[str, OpReading]
    bucket: NotRequired[BucketAdvice]
    harness_overhead: NotRequired[float]


class CommResult(Sweep):
    """``comm.json``."""

    settings: dict[str, Any]
    ceilings: dict[str, float]
    """The machine's loopback TCP, memcpy and between-node ceilings, GB/s."""
    machine: dict[str, Any]
    analysis: NotRequired[Analysis]
