"""``rankwise bench``'s records: a row's runs as :func:`rankwise.tools.bench.suite.run_all` gathers
them, its equivalence columns, its cause of lost time, and the row of the table (``report.json``'s
``rows``, ``--json``) that the report, ``--explain`` and the exit code read.  JSON is the wire
format; tuples come back as lists.

A run's own result (``RunResult``) is what ``rankwise train --json`` (or a baseline loop) printed,
plus ``wall_s`` and ``run_dir``, or ``{"error"}``: the app's summary, whose fields
:mod:`rankwise.train` documents.
"""

from __future__ import annotations

from typing import Any, TypedDict

from typing_extensions import NotRequired

from rankwise.measure.records import Breakdown

RunResult = dict[str, Any]
"""One run of a row: the app's or the baseline's summary (``steady_samples_per_s``, ``accuracy``,
``peak_rss_mb``, ``breakdown``, ...) plus ``wall_s`` and ``run_dir``; a run that could not run:
``error`` (and ``wall_s``)."""


class EquivalenceColumns(TypedDict, total=False):
    """A row's equivalence to one process by its criterion
    (:mod:`rankwise.tools.bench.equivalence`); empty where no check ran."""

    equivalent: bool | None
    """True: equivalent; False: not; None: undecided (not comparable, could not run, unchecked)."""
    verdict: str | None
    """``equivalent``, ``not equivalent``, ``not comparable``, ``could not run``, ``unchecked`` or
    ``reference``."""
    compared_steps: int
    """Optimizer steps compared."""
    compared: str
    """What was compared, in words (dropout off, separate runs)."""
    max_param_diff: float | None
    """The largest weight difference over the compared steps."""
    max_gradient_diff: float | None
    """The largest relative gradient difference (lockstep only)."""
    tolerance: float | None
    """The weights' tolerance the verdict used."""
    gradient_tolerance: float | None
    """The gradients' tolerance (lockstep only)."""
    reason: str | None
    """Why the verdict is not ``equivalent``, or why the check could not run (in a :class:`BenchRow`
    that could not run: its first run's error)."""
    criterion: str | None
    """``reference`` (single), ``lockstep`` (rankwise verify) or ``weights`` (separate runs'
    weights)."""
    criterion_note: str | None
    """Why this criterion where it is not the lockstep one, or what lockstep ran instead of the
    row's name."""


class RowRecord(TypedDict):
    """One row's runs (repeats kept) and its checks, as measured: ``report.json``'s ``runs``."""

    row: str
    """The row's name (:data:`rankwise.tools.bench.rows.ROWS`)."""
    about: str
    """What the row runs, in words."""
    processes: int
    """Processes the row runs."""
    threads: int
    """Threads per process."""
    tolerance: float
    """The row's stated equivalence tolerance (:mod:`rankwise.measure.tolerance`)."""
    runs: list[RunResult]
    """Each repeat's run, in the order they ran."""
    missing: str | None
    """Why the row cannot run here (a library not installed, with its install command), else
    None."""
    eval_expected: NotRequired[int]
    """Samples of the evaluation split: what every run's evaluation should count."""
    eval_count_ok: NotRequired[bool]
    """Whether every run evaluated exactly ``eval_expected`` samples (no duplicates from padded
    shards)."""
    equivalence: NotRequired[EquivalenceColumns]
    """The row's equivalence columns (empty where no check ran)."""


class Explanation(TypedDict):
    """A row's largest loss of step time and its fix (:func:`rankwise.tools.bench.why.explain`)."""

    part: str | None
    """``straggler``, ``data``, ``comm`` or ``sync``; None: nothing above the noise;
    ``unexplained``: the profiled steps do not stand for the timed window
    (:mod:`rankwise.tools.bench.why_window`)."""
    rank: int | None
    """The rank that loses it (None with ``part``)."""
    ms: float
    """Milliseconds a step it loses."""
    share: float
    """Its share of the step."""
    line: str
    """The cause and its fix, in words."""


class BreakdownColumns(TypedDict, total=False):
    """A row's breakdown entries in its table row (:func:`rankwise.tools.bench.why.summary`)."""

    breakdown: Breakdown | None
    """The profiled steps' breakdown per rank (:func:`rankwise.measure.breakdown.combine`), where
    the row was profiled."""
    steps: dict[str, float] | None
    """The table's step cells: compute, comm, data, sync and wait, in milliseconds a step."""
    why: Explanation | None
    """The row's largest loss and its fix."""


class BenchRow(EquivalenceColumns, BreakdownColumns):
    """One line of the table: medians over repeats of a row's runs, its checks
    (:class:`EquivalenceColumns`: the equivalence, its ``tolerance`` the one it used) and its
    breakdown (:class:`BreakdownColumns`)."""

    row: str
    """The row's name."""
    about: str
    """What the row runs, in words."""
    processes: int
    """Processes the row runs."""
    threads: int
    """Threads per process."""
    status: str
    """``ok``, ``could not run``, ``not run`` or ``not installed: ...``."""
    wall_s: NotRequired[float | None]
    """Median wall time of a run (seconds)."""
    samples_per_s: NotRequired[float | None]
    """Median steady-state training throughput (the timed window)."""
    tokens_per_s: NotRequired[float | None]
    """Median steady-state tokens a second (where batches say their tokens)."""
    tflops_per_s: NotRequired[float | None]
    """Median model TFLOP/s (four significant figures)."""
    mfu: NotRequired[float | None]
    """Median model FLOPs utilisation against the measured peak."""
    mfu_datasheet: NotRequired[float | None]
    """Median utilisation against the datasheet peak (known GPUs)."""
    speedup: NotRequired[float | None]
    """Throughput against ``single``'s."""
    peak_rss_mb: NotRequired[list[float]]
    """Each rank's peak resident memory in the first run (MB)."""
    accuracy: NotRequired[float]
    """Test accuracy after the first run."""
    macro_f1: NotRequired[float]
    """Macro-F1 after the first run."""
    eval_samples: NotRequired[int]
    """Samples the first run evaluated."""
    eval_expected: NotRequired[int]
    """Samples it should have evaluated."""
    eval_count_ok: NotRequired[bool]
    """Whether every run evaluated exactly ``eval_expected``."""
    accuracy_ok: NotRequired[bool]
    """Whether the accuracy is within one point of ``single``'s."""


class PairedRatio(TypedDict):
    """One row's throughput over another's, over the repeats (a repeat's two runs are neighbours:
    a pair)."""

    median: float
    """The median of the pairs' ratios."""
    pairs: list[float]
    """Each pair's ratio, in repeat order."""


class Reading(TypedDict):
    """What the report concludes (``report.json``'s ``reading``), and what the exit code reads."""

    fastest_passing: str | None
    """The fastest row that passes every check."""
    fastest_passing_speedup: float | None
    """Its throughput over ``single``'s."""
    ddp_vs_plain_ddp: PairedRatio | None
    """rankwise's ``ddp`` over the hand-written DDP loop."""
    ddp_vs_plain_accelerate: PairedRatio | None
    """rankwise's ``ddp`` over Accelerate as its documentation shows it."""
    plain_ddp_vs_per_step_sync: PairedRatio | None
    """The hand-written loop over the same with a synchronisation every step."""
    scaling_efficiency: dict[str, float]
    """Each multi-process row's throughput over the cores it used times one thread's."""
    failing: list[str]
    """Rows whose check ran and failed (equivalence, the evaluation count, accuracy)."""
    not_run: list[str]
    """Rows the report cannot vouch for: not measured, or a check that could not run or judge."""
    unchecked: dict[str, str]
    """Each measured row without a verdict, and why."""


class BenchSummary(TypedDict):
    """``report.json``: the table, the reading, what the run was, and every run measured."""

    rows: list[BenchRow]
    reading: Reading
    meta: dict[str, Any]
    """The preset, data, model, steps, processes, libraries and machine."""
    runs: list[RowRecord]
