"""The collectives and sync points of a script: the collectives it calls itself (by call site,
timed), the values it reads back to Python (``.item()``: on a GPU each waits for the device), the
DDP communication hook it registers, and the process group it joined and left.  (Its ``torch.save``
calls: :mod:`rankwise.tools.watch.saves`.)"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import torch
import torch.distributed as dist

from rankwise.compat.watch_patches import HOROVOD_COLLECTIVE_NAMES
from rankwise.tools.watch.gathered import GatherWatch
from rankwise.tools.watch.ranks import ReplacementMaker, call_site, outside_the_script, patch
from rankwise.tools.watch.records import CallSiteRecord
from rankwise.tools.watch.shard_metrics import MetricWatch

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

COLLECTIVES = (
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
"""The torch.distributed calls a script may make itself (DDP's own gradient exchange is not among
them)."""
SYNCHRONISING = frozenset({"barrier", "monitored_barrier"})
"""Of those, the ones that carry no data."""


class _SiteCount(TypedDict):
    """A call site's calls so far (:class:`~rankwise.tools.watch.records.CallSiteRecord` once
    summarised)."""

    calls: int
    seconds: float
    steps: set[int]
    """The optimizer steps (taken before the call) it was called in."""


class CallWatch:
    def __init__(self, step: Callable[[], int]):
        self.step = step
        """Returns the optimizer steps taken so far."""
        self.collectives: dict[str, _SiteCount] = {}
        self.comm_hook = "none"
        self.collective_seconds = 0.0
        """Seconds in the script's own collectives since the last optimizer step."""
        self.calls = 0
        """The collectives so far that carry data and that the script or a framework made (torch's
        own inside a module, such as FSDP's all-gathers, and barriers do not count): what can
        combine an evaluation."""
        self.deduplicated = 0
        """Calls of ``accelerate.Accelerator.gather_for_metrics`` (it drops the samples a sampler
        repeated)."""
        self.gathered = GatherWatch()
        """Accelerate's ``gather`` results, and the rows the script cut off them (the repeats of an
        evaluation's last batch, dropped by hand)."""
        self._frameworks_patched = False
        self.destroyed_group = False
        """Whether the script closed its process group itself (``dist.destroy_process_group``)."""
        self.joined: tuple[int, int] | None = None
        """(rank, world size) while the script's process group was open (a script may close it
        before the end)."""
        self.left: tuple[int, int] | None = None
        """(rank, world size) of the process group when it was destroyed (by the script, a framework
        or rankwise)."""
        self.metrics = MetricWatch()
        """The loss and metrics a rank reports from its own shard (it hears of the reads and
        collectives here)."""
        self.reads: dict[str, _SiteCount] = {}
        """``.item()`` calls in the script's own lines, by call site: each one a host-device sync on
        a GPU."""
        self.region: Callable[[str], contextlib.AbstractContextManager[object]] = lambda site: (
            contextlib.nullcontext()
        )
        """A context around each of those calls, by its site (a benchmark's profiled steps mark
        them)."""

    def install(self) -> None:
        patch(torch.Tensor, "item", self._item)
        for name in COLLECTIVES:
            if hasattr(dist, name):
                patch(dist, name, self._collective(name))
        patch(dist, "destroy_process_group", self._destroy)
        from torch.nn.parallel import DistributedDataParallel

        patch(DistributedDataParallel, "register_comm_hook", self._comm_hook)

    def name_exchange(self, name: str) -> None:
        """How the gradients are exchanged, where a framework says it (Horovod's compression): the
        report names the exchange by it."""
        self.comm_hook = name

    def in_group(self, rank: int, world: int) -> None:
        """The script's process group as a step saw it open."""
        self.joined = (rank, world)

    def mark_reads_with(
        self, region: Callable[[str], contextlib.AbstractContextManager[object]]
    ) -> None:
        """Put each ``.item()`` of the script's in ``region(site)`` (a benchmark's profiled steps
        mark them)."""
        self.region = region

    def joined_alone(self, rank: int) -> None:
        """A rank that never joined a process group (an ``mp.spawn`` child that ran alone): its
        record is its own, as rank ``rank`` of 1."""
        if self.joined is None:
            self.joined = (rank, 1)

    def take_collective_seconds(self) -> float:
        """The seconds in the script's own collectives since the last optimizer step (each step
        takes them)."""
        seconds, self.collective_seconds = self.collective_seconds, 0.0
        return seconds

    def records(self) -> dict[str, CallSiteRecord]:
        return _summarised(self.collectives)

    def read_records(self) -> dict[str, CallSiteRecord]:
        return _summarised(self.reads)

    def _item(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watcher = self

        def item(tensor: torch.Tensor) -> Any:
            caller = sys._getframe(1).f_code.co_filename
            if outside_the_script(caller) or "site-packages" in caller:
                # torch's, a framework's or rankwise's own read: not the script's line
                return original(tensor)
            site, started = f".item() at {call_site()}", time.perf_counter()
            try:
                with watcher.region(site):
                    value = original(tensor)
                watcher.metrics.read(tensor, site, value)
                return value
            finally:
                _count(watcher.reads, site, time.perf_counter() - started, watcher.step())

        return item

    def _collective(self, name: str) -> ReplacementMaker:
        watcher = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                site = f"{name} at {call_site(via=True)}"
                started, by_torch = (
                    time.perf_counter(),
                    "/torch/" in sys._getframe(1).f_code.co_filename,
                )
                # (torch's own, such as FSDP's all-gathers, are its communication, not the script's
                # syncs)
                if not by_torch:
                    watcher.metrics.collective(args)
                try:
                    with contextlib.nullcontext() if by_torch else watcher.region(site):
                        return original(*args, **kwargs)
                finally:
                    spent = time.perf_counter() - started
                    if name not in SYNCHRONISING and not by_torch:
                        watcher.calls += 1
                    _count(watcher.collectives, site, spent, watcher.step())
                    watcher.collective_seconds += spent

            return call

        return make

    def patch_frameworks(self) -> None:
        """Once the script imported its framework (at its model's first forward): the gathers that
        drop a padded shard's repeats, counted -- Accelerate's ``gather_for_metrics`` and
        rankwise's own exact gather (``rt.eval_gatherer(...).result()``); Accelerate's ``gather``,
        whose repeats a script may cut itself (:mod:`rankwise.tools.watch.gathered`); Horovod's
        collectives; Lightning's and torchmetrics' metrics
        (:mod:`rankwise.tools.watch.shard_metrics`)."""
        if self._frameworks_patched:
            return
        self._frameworks_patched = True
        self.metrics.patch_frameworks()
        accelerator = sys.modules.get("accelerate.accelerator")
        if accelerator is not None:
            patch(accelerator.Accelerator, "gather_for_metrics", self._deduplicating)
            patch(accelerator.Accelerator, "gather", self.gathered.patched)
        ours = sys.modules.get("rankwise.dist")
        if ours is not None:
            patch(ours, "gather_exact", self._deduplicating)
        # (Horovod opens no torch process group: a Horovod script's own collectives are Horovod's)
        horovod = sys.modules.get("horovod.torch")
        if horovod is not None:
            for name in HOROVOD_COLLECTIVE_NAMES:
                if hasattr(horovod, name):
                    patch(horovod, name, self._collective(f"hvd.{name}"))

    def _deduplicating(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watcher = self

        def deduplicating(*args: Any, **kwargs: Any) -> Any:
            watcher.deduplicated += 1
            return original(*args, **kwargs)

        return deduplicating

    def _destroy(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watcher = self

        def destroy(*args: Any, **kwargs: Any) -> Any:
            if caller_is_the_script():
                watcher.destroyed_group = True
            # (the default group, not a subgroup)
            if not args and not kwargs and dist.is_initialized():
                watcher.left = dist.get_rank(), dist.get_world_size()
            return original(*args, **kwargs)

        return destroy

    def _comm_hook(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watcher = self

        def register(ddp: DistributedDataParallel, state: object, hook: Callable[..., Any]) -> Any:
            watcher.comm_hook = getattr(hook, "__name__", str(hook))
            return original(ddp, state, hook)

        return register


def caller_is_the_script() -> bool:
    """Whether the function calling the patched one was called from the script's (or a framework's)
    code."""
    return not outside_the_script(sys._getframe(2).f_code.co_filename)


def _count(sites: dict[str, _SiteCount], site: str, seconds: float, step: int) -> None:
    entry = sites.setdefault(site, {"calls": 0, "seconds": 0.0, "steps": set()})
    entry["calls"] += 1
    entry["seconds"] += seconds
    entry["steps"].add(step)


def _summarised(sites: dict[str, _SiteCount]) -> dict[str, CallSiteRecord]:
    return {
        site: {"calls": v["calls"], "seconds": round(v["seconds"], 6), "steps": len(v["steps"])}
        for site, v in sites.items()
    }
