"""Metrics a rank reports from its own shard as if they were the whole batch's or the whole set's.

Three ways a script does it, each watched where it happens:

* a Lightning ``self.log(name, tensor)`` at epoch level (a validation or test hook, or
  ``on_epoch=True``) without ``sync_dist=True``: each rank logs its own mean, and the logger and
  checkpoint callbacks read rank 0's (Lightning itself warns, once, on rank 0);
* a torchmetrics ``Metric`` computed with ``sync_on_compute=False`` at several ranks: its states are
  never gathered, so its value is the rank's shard's;
* the training loss read back (``loss.item()``) by rank 0 alone, never reduced across the ranks,
  or printed with Fabric's ``fabric.print`` (rank 0's line only): the loss of one rank's share of
  the global batch, printed or logged as the step's;
* that loss printed with ``print`` on every rank: N lines for one step, each a shard's loss, none
  the global batch's.
"""

from __future__ import annotations

import builtins
import gc
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from rankwise.tools.watch.ranks import call_site, outside_the_script, patch, rank_and_world
from rankwise.tools.watch.records import MetricsRecord

if TYPE_CHECKING:
    import lightning.pytorch
    import pytorch_lightning
    from torchmetrics import Metric

    LightningModule = lightning.pytorch.LightningModule | pytorch_lightning.LightningModule

LIGHTNING_MODULES = ("lightning.pytorch", "pytorch_lightning")
FABRIC_MODULES = ("lightning.fabric.fabric", "lightning_fabric.fabric")


def _storage(tensor: object) -> int | None:
    """Where a tensor's data lives (a view or ``.detach()`` of it shares it)."""
    if not isinstance(tensor, torch.Tensor) or tensor.is_meta:
        return None
    try:
        return tensor.untyped_storage().data_ptr()
    except RuntimeError:  # (a tensor subclass without storage)
        return None


class MetricWatch:
    def __init__(self) -> None:
        self.unsynced_logs: dict[str, str] = {}
        """Lightning ``self.log`` names logged at epoch level without ``sync_dist``, by call
        site."""
        self.unsynced_metrics: dict[str, str] = {}
        """torchmetrics metrics computed without syncing at several ranks: class name -> site."""
        self.loss_reads: dict[str, int] = {}
        """Reads of the training loss's value that no collective had reduced, by call site."""
        self.printed_losses: dict[str, int] = {}
        """``fabric.print`` calls whose text shows that value, by call site."""
        self.loss_prints: dict[str, int] = {}
        """The script's own ``print`` calls whose text shows that value, by call site."""
        self._loss_value: float | None = None
        self._loss: int | None = None
        self._loss_reduced = False
        self._patched = False

    # -- the training loss ------------------------------------------------------------------------

    def loss_seen(self, loss: torch.Tensor) -> None:
        """A backward of ``loss``: the tensor whose reads are watched until the next one."""
        self._loss, self._loss_reduced, self._loss_value = _storage(loss), False, None

    def collective(self, args: tuple[Any, ...]) -> None:
        """A collective of the script's: one over the loss's data (an in-place ``all_reduce``)
        makes its value the ranks' together."""
        if args and self._loss is not None and _storage(args[0]) == self._loss:
            self._loss_reduced, self._loss_value = True, None

    def read(self, tensor: torch.Tensor, site: str, value: object) -> None:
        """The script read ``tensor``'s ``value`` at ``site``."""
        if self._loss is not None and not self._loss_reduced and _storage(tensor) == self._loss:
            self.loss_reads[site] = self.loss_reads.get(site, 0) + 1
            self._loss_value = float(value) if isinstance(value, int | float) else None

    # -- the frameworks' metrics ------------------------------------------------------------------

    def patch_frameworks(self) -> None:
        """Once the script imported its framework: Lightning's ``log``, and each torchmetrics
        metric built from then on."""
        if self._patched:
            return
        self._patched = True
        for name in LIGHTNING_MODULES:
            module = sys.modules.get(f"{name}.core.module")
            if module is not None:
                patch(module.LightningModule, "log", self._log)
        for name in FABRIC_MODULES:
            module = sys.modules.get(name)
            if module is not None:
                patch(module.Fabric, "print", self._fabric_print)
        patch(builtins, "print", self._print)
        metric = sys.modules.get("torchmetrics.metric")
        if metric is not None:
            patch(metric.Metric, "__init__", self._metric_built)
            # (and those built before: a LightningModule's, a script's built before its model ran)
            for found in gc.get_objects():
                try:
                    if isinstance(found, metric.Metric):
                        self.metric_seen(found)
                except ReferenceError:  # (a weakref.proxy whose object is gone)
                    continue

    def _log(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def log(
            module: LightningModule, name: str, value: object, *args: Any, **kwargs: Any
        ) -> Any:
            if (
                isinstance(value, torch.Tensor)
                and not kwargs.get("sync_dist", False)
                and rank_and_world()[1] > 1
                and _epoch_level(module, kwargs.get("on_epoch"))
                and not outside_the_script(sys._getframe(1).f_code.co_filename)
            ):
                watch.unsynced_logs.setdefault(name, call_site())
            return original(module, name, value, *args, **kwargs)

        return log

    def _fabric_print(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def fabric_print(fabric: object, *args: Any, **kwargs: Any) -> Any:
            value = watch._loss_value
            if (
                value is not None
                and rank_and_world()[1] > 1
                and any(_shows(str(arg), value) for arg in args)
            ):
                site = call_site()
                watch.printed_losses[site] = watch.printed_losses.get(site, 0) + 1
            return original(fabric, *args, **kwargs)

        return fabric_print

    def _print(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def print_(*args: Any, **kwargs: Any) -> Any:
            value = watch._loss_value
            if (
                value is not None
                and not outside_the_script(sys._getframe(1).f_code.co_filename)
                and rank_and_world()[1] > 1
                and any(_shows(str(arg), value) for arg in args)
            ):
                site = call_site()
                watch.loss_prints[site] = watch.loss_prints.get(site, 0) + 1
            return original(*args, **kwargs)

        return print_

    def _metric_built(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def init(metric: Metric, *args: Any, **kwargs: Any) -> None:
            original(metric, *args, **kwargs)
            watch.metric_seen(metric)

        return init

    def metric_seen(self, metric: Metric) -> None:
        """A torchmetrics metric: its compute is watched where it never syncs.  (sync_on_compute:
        torchmetrics' own setting, True by default: only then are the states gathered.  Each metric
        wraps its compute per object in __init__, so the object's is the one to watch.)"""
        if getattr(metric, "sync_on_compute", True) or getattr(metric, "_rankwise_watched", False):
            return
        watch, computes = self, metric.compute

        def compute(*args: Any, **kwargs: Any) -> Any:
            if rank_and_world()[1] > 1:
                watch.unsynced_metrics.setdefault(type(metric).__name__, call_site())
            return computes(*args, **kwargs)

        # ignore[method-assign]: the object's own compute replaced, as torchmetrics' __init__ does
        metric.compute, metric._rankwise_watched = compute, True  # type: ignore[method-assign]

    def records(self) -> MetricsRecord:
        return {
            "unsynced_logs": dict(self.unsynced_logs),
            "unsynced_metrics": dict(self.unsynced_metrics),
            "loss_reads": dict(self.loss_reads),
            "printed_losses": dict(self.printed_losses),
            "loss_prints": dict(self.loss_prints),
        }


def _epoch_level(module: LightningModule, on_epoch: bool | None) -> bool:
    """Whether Lightning reduces this log over the epoch: ``on_epoch`` as given, else its default
    (True outside the training hooks)."""
    if on_epoch is not None:
        return bool(on_epoch)
    try:
        return not module.trainer.training
    except RuntimeError:  # (a module attached to no Trainer: Lightning raises)
        return False


def _shows(text: str, value: float) -> bool:
    """Whether ``text`` shows ``value`` as Python formats a float (``repr``, ``:.Nf``, ``:.Ne``,
    ``:.Ng``), in 4 characters or more (a short ``0.00`` shows anything small)."""
    forms = {repr(value), str(value)}
    for digits in range(2, 9):
        forms |= {f"{value:.{digits}f}", f"{value:.{digits}e}", f"{value:.{digits}g}"}
    return any(len(form) >= 4 and form.strip("0.-") and form in text for form in forms)
