"""A Lightning ``Trainer`` script at the launcher's process count: its one-process reference, a
bench row.

A Trainer script names its device count in code (``Trainer(devices=2, strategy="ddp")``) and
Lightning refuses a count other than the launcher's processes, so a watched rank builds every
Trainer with the launcher's devices per node and nodes (the distributed run: as written; the
one-process reference: ``devices=1``); the rest of its settings stay as written.
``PL_TRAINER_DEVICES`` cannot do this: Lightning reads its ``PL_TRAINER_*`` variables as defaults,
under what the script passes.

After ``rankwise verify``'s compared steps each training pass is cut short
(:meth:`~rankwise.tools.watch.loaders.LoaderWatch.shorten`, which also gives the loader its
shortened length); a Trainer that validates at each epoch's end counts that end by the epoch's
batches as it set them up (``val_check_batch``), which a cut pass never reaches, so it is told to
validate when the pass ends instead (:func:`validate_at_each_pass_end`), as it does for data without
a length.  The epoch under way when the cutting began read its length before: it ends without its
validation.
"""

from __future__ import annotations

import importlib
import os
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rankwise.tools.watch.ranks import patch

if TYPE_CHECKING:
    import lightning.pytorch
    import pytorch_lightning

    Trainer = lightning.pytorch.Trainer | pytorch_lightning.Trainer

TRAINERS = ("lightning.pytorch", "pytorch_lightning")
"""Where a Lightning ``Trainer`` class lives (``import lightning as L; L.Trainer`` is
``lightning.pytorch``'s)."""


_trainers: weakref.WeakSet[Trainer] = weakref.WeakSet()
"""The Trainers the script built."""
ENVIRONMENT = "RANKWISE_WATCH_LIGHTNING"
"""Set (to 1) in a watched rank of a Lightning Trainer script."""


def launcher_devices() -> None:
    """Every Lightning ``Trainer`` built from now on runs on the launcher's processes:
    ``LOCAL_WORLD_SIZE`` devices on each of ``WORLD_SIZE / LOCAL_WORLD_SIZE`` nodes."""
    for name in TRAINERS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        patch(module.Trainer, "__init__", _on_launcher_devices)


def _on_launcher_devices(original: Callable[..., Any]) -> Callable[..., Any]:
    def init(trainer: Trainer, *args: Any, **kwargs: Any) -> None:
        local, world = (
            int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            int(os.environ.get("WORLD_SIZE", "1")),
        )
        kwargs |= {"devices": local, "num_nodes": max(1, world // local)}
        _trainers.add(trainer)
        return original(trainer, *args, **kwargs)

    return init


def validate_at_each_pass_end() -> None:
    """Each Trainer that validates at its epochs' ends validates at the end of each (cut) training
    pass instead."""
    for trainer in _trainers:
        batches = getattr(trainer.fit_loop, "max_batches", None)
        if trainer.check_val_every_n_epoch is not None and trainer.val_check_batch == batches:
            # what Lightning does for data without a length: at its end
            trainer.val_check_batch = float("inf")
