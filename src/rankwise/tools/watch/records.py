"""What a watched rank writes for the commands that read it: the facts of a traced run
(``trace-facts.json``), one pass over a DataLoader, and the rank's record at its end
(``watch-rank{rank}.json``).

They cross a process boundary as JSON: these types say what the writer puts there and what a reader
may take out (tuples come back as lists).  Written by :mod:`rankwise.tools.watch` (the watcher, its
loader watch, ``seen``), read by ``verify`` (:mod:`rankwise.tools.verify`), the watch's findings and
``bench``.
"""

from __future__ import annotations

from typing import TypedDict

from typing_extensions import NotRequired


class DropoutModule(TypedDict):
    """A dropout module with p > 0 the watcher found in a model
    (:func:`rankwise.tools.step_trace.switch_off_dropout`)."""

    module: str
    """Its qualified name in the model."""
    type: str
    """Its class (``Dropout``, ...)."""
    p: float
    """Its probability as the script built it (the watcher sets it to 0 unless asked to keep
    dropout)."""


class WatchedFacts(TypedDict):
    """What a traced run's models and set-up hold that can make N ranks compute something else than
    one process: ``trace-facts.json``, which ``verify`` reads to choose its tolerances and explain a
    difference."""

    dropout: list[DropoutModule]
    """Every dropout module with p > 0 in the models the script ran."""
    dropout_kept: bool
    """Whether those modules kept their p (``verify --keep-dropout``) rather than being set to 0."""
    half_params: list[str]
    """The 16-bit dtypes of trainable parameters (``float16``, ``bfloat16``)."""
    batch_dependent: list[str]
    """Layer classes that normalise over the batch (BatchNorm; InstanceNorm tracking running
    statistics)."""
    precision: str
    """The run's precision: rankwise's or DeepSpeed's setting, else ``32-true`` (the script's own
    autocast unseen)."""
    device: str
    """The device type of the model's parameters (``cpu``, ``cuda``)."""
    comm_hook: str
    """DDP's gradient communication hook (``none``, ``fp16_compress``, ...)."""
    tf32: bool
    """Whether fp32 products ran on TF32 units."""
    shards_optimizer_state: bool
    """Whether each rank keeps only its share of the optimizer state (so replicas' weights may
    legitimately differ between ranks)."""
    api: str
    """What the script trains with: ``torch``, ``rankwise``, ``deepspeed``, ``horovod``."""
    strategy: NotRequired[str]
    """The strategy rankwise or DeepSpeed ran (absent for a plain torch script)."""


DatasetDescription = TypedDict(
    "DatasetDescription",
    {
        "class": str,  # the dataset's class name
        # file:line of the class's definition (None: not found, a built-in class)
        "defined_at": "str | None",
        "module": str,  # the module that defines the class
    },
)
"""A DataLoader's dataset: its class and where the class is defined (the script's own class: where
its data is made).  Functional form, since ``class`` is a keyword."""


class PassRecord(TypedDict):
    """One pass over a DataLoader on one rank
    (:class:`rankwise.tools.watch.loaders.LoaderWatch`)."""

    loader: int
    """The loader's number on this rank, in the order the script first iterated them."""
    dataset_size: int | None
    """Samples in its dataset (None: an iterable dataset without a length)."""
    batch_size: int | None
    """The loader's batch size (None: it batches with its own batch sampler)."""
    sampler: str | None
    """The sampler that orders the pass (``DistributedSampler``, ``SequentialSampler``, ``X in
    BatchSamplerShard``)."""
    distributed_sampler: bool
    """Whether a DistributedSampler orders it (directly or inside a batch sampler)."""
    shuffle: bool | None
    """That DistributedSampler's shuffle (None without one)."""
    epoch: int | None
    """That DistributedSampler's epoch when the pass began (None without one)."""
    samples: int
    """Samples the pass yielded."""
    trained: int
    """Samples of it a backward consumed."""
    first: list[str]
    """The digests of its first 8 samples (the sharding check: do ranks see other samples?)."""
    complete: bool
    """Whether it ran to its last batch."""
    site: str | None
    """The script's line that built the loader (None: a framework built it)."""
    cut_after: int | None
    """Batches it yielded before the watcher cut it (None: not cut)."""
    batches: int | None
    """The loader's length in batches (None: it has none)."""
    dataset: DatasetDescription
    """The dataset's class and where it is defined."""
    collectives_at_start: tuple[int, int, int]
    """The data-carrying collectives, ``gather_for_metrics`` calls and rows cut off gathered tensors
    so far when the pass began (JSON: a list)."""
    collectives_after: int | None
    """Data-carrying collectives from its start to the next training pass (or the end)."""
    deduplicated_after: int | None
    """``gather_for_metrics`` calls (which drop a padded shard's repeats) in that span."""
    trimmed_after: NotRequired[int | None]
    """Rows the script cut off what Accelerate's ``gather`` returned in that span (the repeats,
    dropped by hand: :mod:`rankwise.tools.watch.gathered`)."""
    sample_indices: list[tuple[int, str]]
    """(dataset index, digest) of its first 8 samples (map-style datasets; JSON: lists)."""
    trained_batches: NotRequired[int]
    """Batches of it a backward consumed (absent: none)."""
    indices: NotRequired[list[list[int] | None]]
    """Each trained batch's dataset indices (None: not a list of indices), for a following
    reference."""


class MetricsRecord(TypedDict):
    """What a rank reported from its own shard (:mod:`rankwise.tools.watch.shard_metrics`)."""

    unsynced_logs: dict[str, str]
    """Lightning ``self.log`` names at epoch level without ``sync_dist``, with their call site."""
    unsynced_metrics: dict[str, str]
    """torchmetrics metrics computed without syncing at several ranks, with their call site."""
    loss_reads: dict[str, int]
    """Reads of the training loss no collective had reduced, by call site."""
    printed_losses: NotRequired[dict[str, int]]
    """``fabric.print`` calls (rank 0's line only) showing that loss, by call site."""
    loss_prints: NotRequired[dict[str, int]]
    """The script's ``print`` calls showing that loss, by call site."""


class CallSiteRecord(TypedDict):
    """A line of the script that called a collective or read a value back (``.item()``), and how
    often (:class:`rankwise.tools.watch.calls.CallWatch`)."""

    calls: int
    """Its calls."""
    seconds: float
    """Their wall time, together."""
    steps: int
    """How many optimizer steps it was called in (counted by the steps taken before each call)."""


class SaveRecord(TypedDict):
    """One ``torch.save`` call of the script's (:class:`rankwise.tools.watch.saves.SaveWatch`)."""

    path: str
    """The file it wrote (resolved), or the ``repr`` of the buffer it wrote to."""
    site: str
    """The script's line that called it."""
    module_prefix: bool
    """Whether the saved state's keys (or those of a dict in it) start with a wrapper's
    ``module.``."""
    step: int
    """The optimizer steps taken when it was called."""


class RankRecord(TypedDict):
    """What one watched rank saw, written at its end (``watch-rank{rank}.json``,
    :mod:`rankwise.tools.watch.seen`) for the findings that need no reference."""

    rank: int
    """The rank's global rank (0 where the script never joined a process group)."""
    world_size: int
    """The process group's size (1 where the script never joined one)."""
    steps: int
    """Optimizer steps the rank took."""
    passes: list[PassRecord]
    """Its passes over DataLoaders, in the order they began."""
    set_epoch_calls: int
    """Calls of ``DistributedSampler.set_epoch``."""
    collectives: dict[str, CallSiteRecord]
    """The script's collectives by call site (calls, seconds, steps)."""
    reads: dict[str, CallSiteRecord]
    """``.item()`` calls in the script's lines, by call site (each a host-device sync on a GPU)."""
    metrics: NotRequired[MetricsRecord]
    """What it reported from its own shard."""
    device: str
    """The device type of the model's parameters."""
    saves: list[SaveRecord]
    """The script's ``torch.save`` calls (what, where, on which rank and step)."""
    replicas_differ: list[int]
    """Steps after which the ranks' replicas held different weights."""
    summed_loss: NotRequired[str | None]
    """How the first training loss summed over its batch (None: a mean, or normalised by the
    script: :mod:`rankwise.tools.watch.reduction`)."""
    unscaled: list[str]
    """Loaders a reference could not scale to the global batch (their own batch sampler), by
    site."""
    step_seconds: list[float]
    """Each optimizer step's wall time."""
    step_collective_seconds: list[float]
    """Each step's seconds in the script's own collectives."""
    scale: int
    """The factor a one-process reference multiplied batch sizes by (1: not a reference)."""
    dropout: list[DropoutModule]
    """The dropout modules with p > 0 found."""
    framework_world_size: int | None
    """The process count Accelerate settled on, where the script used it."""
    api: str
    """What the script trains with (:attr:`WatchedFacts.api`)."""
    window_steps: int
    """The step the watcher ends the script at."""
    keep_batches: int | None
    """After the compared window: the batches a training pass yields before it is cut (None: as
    written)."""
    first_inputs: NotRequired[list[str]]
    """Where the script makes its own batches (no DataLoader): digests of its first training
    forward's first 8 input rows."""
    ended_by: str
    """How the script ended: ``watcher``, ``script`` or ``failure``."""
    destroyed_group: bool
    """Whether the script closed its process group itself."""


class FindingRecord(TypedDict):
    """A finding as a report holds it (:class:`rankwise.tools.watch.findings.Finding`, or the
    comparison's own): something the runs showed besides the comparison."""

    level: str
    """``error`` (changes results: exit 1), ``failed`` (part of the script was not checked) or
    ``warning``."""
    kind: str
    """What was found, as a word a program can match (docs/how-to/verify.md: "What verify
    names")."""
    text: str
    """What was found and what to do, in words."""
