"""What the watcher (``rankwise verify``, ``bench --script``: ``rankwise.tools.watch``) replaces in
torch and in the frameworks to watch a training script unchanged: every attribute, why no public API
serves, and the releases it was checked on (:class:`~rankwise.compat.versions.Patch`).

The watcher makes every replacement through :func:`checked` (``rankwise.tools.watch.ranks.patch``):
a target not recorded here is refused, and a recorded one on a release series it was not checked on
warns once. ``tests/compat/test_watch_patches.py`` shows on the installed releases that each target
is there and, for the private ones, that it still does what the watcher relies on.

Besides replacing these, the watcher tags objects with attributes of its own (``_rankwise_*``): the
DataLoader iterators (their pass and position, read by its ``_next_index``), Horovod's
``_DistributedOptimizer`` class (its steps are watched at its ``step``), a DeepSpeed engine (seen).
Torch's public hooks serve the rest: the global optimizer step hooks and module forward hooks.
"""

from __future__ import annotations

from types import ModuleType

from rankwise.compat.versions import Patch

TORCH = ("2.13",)
DATA = "torch.utils.data"

BACKWARD = Patch(
    "torch.Tensor.backward",
    "torch",
    "each backward: the loss, the batch it consumed, whether its forward drew random numbers; no "
    "hook sees a backward's loss before autograd runs",
    TORCH,
)
ITEM = Patch(
    "torch.Tensor.item",
    "torch",
    "the script's own .item() reads by line (a host-device sync each on a GPU); torch has no hook "
    "on them",
    TORCH,
)
SAVE = Patch("torch.save", "torch", "what the script saves, from which line, at which step", TORCH)
COLLECTIVE_NAMES = (
    "all_reduce",
    "barrier",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "scatter",
    "gather_object",
    "all_to_all",
    "all_to_all_single",
    "monitored_barrier",
)
COLLECTIVES = tuple(
    Patch(
        f"torch.distributed.{name}",
        "torch",
        "the script's own collectives by line, timed (torch's flight recorder is private and not "
        "on every backend)",
        TORCH,
    )
    for name in COLLECTIVE_NAMES
)
HOROVOD_COLLECTIVE_NAMES = (
    "allreduce",
    "allreduce_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "allgather",
    "allgather_object",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "alltoall",
    "reducescatter",
)
"""Horovod's collectives a script calls itself (its DistributedOptimizer's own use the ``_async``
ones underneath)."""
HOROVOD_COLLECTIVES = tuple(
    Patch(
        f"horovod.torch.{name}",
        "horovod",
        "the script's own Horovod collectives by line (what combines an evaluation's counts)",
        ("0.28",),
    )
    for name in HOROVOD_COLLECTIVE_NAMES
)
DESTROY = Patch(
    "torch.distributed.destroy_process_group",
    "torch",
    "who closed the process group, and the rank and world size it had",
    TORCH,
)
COMM_HOOK = Patch(
    "torch.nn.parallel.distributed.DistributedDataParallel.register_comm_hook",
    "torch",
    "the DDP communication hook the script registers, by name (DDP keeps it in a private "
    "attribute)",
    TORCH,
)
SCHEDULER_INIT = Patch(
    "torch.optim.lr_scheduler.LRScheduler.__init__",
    "torch",
    "every learning-rate scheduler the script builds, to record its state at each optimizer step "
    "(a scheduler is not reachable from the optimizer it drives; subclasses call this __init__)",
    TORCH,
)
PLATEAU_INIT = Patch(
    "torch.optim.lr_scheduler.ReduceLROnPlateau.__init__",
    "torch",
    "the same for ReduceLROnPlateau, whose __init__ does not call its base's",
    TORCH,
)
LOADER_INIT = Patch(
    f"{DATA}.dataloader.DataLoader.__init__",
    "torch",
    "where the script builds each loader; in the one-process reference, N times its batch",
    TORCH,
)
LOADER_ITER = Patch(
    f"{DATA}.dataloader.DataLoader.__iter__",
    "torch",
    "each pass over a loader and every batch it yields (a digest per sample); after verify's "
    "window, a training pass cut short",
    TORCH,
)
LOADER_LEN = Patch(
    f"{DATA}.dataloader.DataLoader.__len__",
    "torch",
    "a cut training pass's length, for a framework that counts an epoch's batches",
    TORCH,
)
NEXT_INDEX = Patch(
    f"{DATA}.dataloader._BaseDataLoaderIter._next_index",
    "torch",
    "the dataset indices of each batch an iterator fetches (with workers too: the main process "
    "asks for them), and in the one-process reference the N ranks' indices of that batch instead; "
    "no public API says which samples a batch holds",
    TORCH,
)
SET_EPOCH = Patch(
    f"{DATA}.distributed.DistributedSampler.set_epoch",
    "torch",
    "whether the script calls it",
    TORCH,
)
SAMPLER_INIT = Patch(
    f"{DATA}.distributed.DistributedSampler.__init__",
    "torch",
    "an mp.spawn script's one-process reference: a sampler built for N replicas takes one",
    TORCH,
)
INIT_GROUP = Patch(
    "torch.distributed.init_process_group",
    "torch",
    "what an mp.spawn script's rank passes, and its port checked; in its one-process reference, "
    "world size 1",
    TORCH,
)
START_PROCESSES = Patch(
    "torch.multiprocessing.spawn.start_processes",
    "torch",
    "each child of an mp.spawn script watched (mp.spawn looks it up in this module's globals)",
    TORCH,
)
START_PROCESSES_EXPORTED = Patch(
    "torch.multiprocessing.start_processes",
    "torch",
    "the same, where a script calls the package's",
    TORCH,
)

ENGINE_FORWARD = Patch(
    "deepspeed.runtime.engine.DeepSpeedEngine.forward",
    "deepspeed",
    "the engine's ZeRO stage and precision; a following run's fp32 masters take the N-rank run's "
    "weights",
    ("0.19",),
)
ENGINE_BACKWARD = Patch(
    "deepspeed.runtime.engine.DeepSpeedEngine.backward",
    "deepspeed",
    "the loss the script passed: DeepSpeed back-propagates a scaled copy of it, so the script's "
    "reads of its loss (a per-rank metric) are told by this one",
    ("0.19",),
)
ENGINE_STEP = Patch(
    "deepspeed.runtime.engine.DeepSpeedEngine.step",
    "deepspeed",
    "a step at the accumulation boundary, on DeepSpeed's whole gradients and fp32 weights "
    "(torch's optimizer hooks see flat partitions)",
    ("0.19",),
)
HOROVOD_STEP = Patch(
    "horovod.torch.optimizer._DistributedOptimizer.step",
    "horovod",
    "a step on the gradients Horovod averaged, between its synchronize and its inner step",
    ("0.28",),
)
HOROVOD_BROADCAST_STATE = Patch(
    "horovod.torch.broadcast_optimizer_state",
    "horovod",
    "the zero-gradient step it takes to create the state it broadcasts: not a training step",
    ("0.28",),
)
GATHER_FOR_METRICS = Patch(
    "accelerate.accelerator.Accelerator.gather_for_metrics",
    "accelerate",
    "whether an evaluation's repeated samples were dropped",
    ("1.15",),
)
GATHER = Patch(
    "accelerate.accelerator.Accelerator.gather",
    "accelerate",
    "the rows a script cuts off what it gathered (an evaluation's repeats, dropped by hand)",
    ("1.15",),
)
EXACT_GATHER = Patch(
    "rankwise.dist.gather_exact",
    "rankwise",
    "whether an evaluation's repeated samples were dropped (rt.eval_gatherer's result: rankwise's "
    "own, recorded here with the frameworks' so every replacement has a record)",
    ("0.1",),
)
LIGHTNING_LOG = Patch(
    "lightning.pytorch.core.module.LightningModule.log",
    "lightning",
    "the names a rank logs at epoch level without sync_dist (a metric of its own shard)",
    ("2.6",),
)
PL_LOG = Patch(
    "pytorch_lightning.core.module.LightningModule.log",
    "pytorch_lightning",
    "the same, in the standalone package",
    ("2.6",),
)
FABRIC_PRINT = Patch(
    "lightning.fabric.fabric.Fabric.print",
    "lightning",
    "the training loss a script prints with it (rank 0's line only: its shard's loss)",
    ("2.6",),
)
LIGHTNING_FABRIC_PRINT = Patch(
    "lightning_fabric.fabric.Fabric.print",
    "lightning_fabric",
    "the same, in the standalone package",
    ("2.6",),
)
PRINT = Patch(
    "builtins.print",
    "python",
    "the training loss a script prints on each rank (each rank's line shows its own shard's loss); "
    "a print has no hook, and sys.stdout is the launcher's to redirect",
    ("3.11", "3.12"),
)
TORCHMETRICS_COMPUTE = Patch(
    "torchmetrics.metric.Metric.__init__",
    "torchmetrics",
    "metrics built with sync_on_compute=False, whose compute at several ranks is then watched "
    "(never gathered)",
    ("1.9",),
)
LIGHTNING_TRAINER = Patch(
    "lightning.pytorch.trainer.trainer.Trainer.__init__",
    "lightning",
    "every Trainer on the launcher's devices and nodes (its PL_TRAINER_* variables are only "
    "defaults)",
    ("2.6",),
)
PL_TRAINER = Patch(
    "pytorch_lightning.trainer.trainer.Trainer.__init__",
    "pytorch_lightning",
    "the same, in the standalone package",
    ("2.6",),
)

PATCHES: dict[str, Patch] = {
    record.target: record
    for record in (
        BACKWARD,
        ITEM,
        SAVE,
        *COLLECTIVES,
        *HOROVOD_COLLECTIVES,
        DESTROY,
        COMM_HOOK,
        SCHEDULER_INIT,
        PLATEAU_INIT,
        LOADER_INIT,
        LOADER_ITER,
        LOADER_LEN,
        NEXT_INDEX,
        SET_EPOCH,
        SAMPLER_INIT,
        INIT_GROUP,
        START_PROCESSES,
        START_PROCESSES_EXPORTED,
        ENGINE_FORWARD,
        ENGINE_BACKWARD,
        ENGINE_STEP,
        HOROVOD_STEP,
        HOROVOD_BROADCAST_STATE,
        GATHER_FOR_METRICS,
        GATHER,
        EXACT_GATHER,
        LIGHTNING_LOG,
        PL_LOG,
        FABRIC_PRINT,
        LIGHTNING_FABRIC_PRINT,
        PRINT,
        TORCHMETRICS_COMPUTE,
        LIGHTNING_TRAINER,
        PL_TRAINER,
    )
}
"""Every record, by target."""


def target(owner: type | ModuleType, name: str) -> str:
    """``owner.name`` as a record names it: a class by its ``__module__`` and ``__qualname__``, a
    module by name."""
    where = (
        f"{owner.__module__}.{owner.__qualname__}" if isinstance(owner, type) else owner.__name__
    )
    return f"{where}.{name}"


def checked(owner: type | ModuleType, name: str) -> Patch:
    """The record of replacing ``owner.name``, its version checked
    (:meth:`~rankwise.compat.versions.Patch.check`); ``LookupError`` where there is none: every
    replacement is recorded here first."""
    record = PATCHES.get(target(owner, name))
    if record is None:
        raise LookupError(
            f"{target(owner, name)}: a replacement not recorded in rankwise.compat.watch_patches"
        )
    record.check()
    return record
