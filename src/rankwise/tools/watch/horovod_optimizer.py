"""The watcher in a Horovod script (``hvd.init()``, ``hvd.DistributedOptimizer``), unchanged,
started as ``horovodrun --gloo`` starts it.

Horovod averages the gradients inside its optimizer's ``step`` (``synchronize``), after torch's
optimizer pre-hooks ran, and then steps the wrapped optimizer, whose own hooks run again.  So here a
step is the wrapped optimizer's ``step`` (:func:`watch`): Horovod's ``synchronize`` first, as its
``step`` would, then the watcher's step as in any script, on the gradients Horovod averaged (after
its compression: fp16 compression is reported as the rounding it is), then Horovod's step without a
second ``synchronize``.  The watcher's collectives run over Horovod's own
(``hvd.allgather_object``): a Horovod script opens no torch process group
(:mod:`rankwise.tools.watch.ranks`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rankwise.tools.watch.ranks import patch

if TYPE_CHECKING:
    # (Horovod ships no types: its optimizer is Any to mypy)
    from horovod.torch.optimizer import _DistributedOptimizer

    from rankwise.tools.watch.watcher_view import WatcherView

ENVIRONMENT = "RANKWISE_WATCH_HOROVOD"
"""Set (to 1) in a watched rank of a Horovod script."""


def ranks_from_horovodrun() -> None:
    """Name this process's rank as torchrun would (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), from
    what horovodrun set: the watcher's files, stall deadline and exit guard are per rank."""
    for ours, theirs in (
        ("RANK", "HOROVOD_RANK"),
        ("WORLD_SIZE", "HOROVOD_SIZE"),
        ("LOCAL_RANK", "HOROVOD_LOCAL_RANK"),
        ("LOCAL_WORLD_SIZE", "HOROVOD_LOCAL_SIZE"),
    ):
        if theirs in os.environ:
            os.environ.setdefault(ours, os.environ[theirs])


def watch(watcher: WatcherView) -> None:
    """Watch every Horovod ``DistributedOptimizer`` the script builds (before it builds them:
    Horovod copies the methods into each optimizer's class)."""
    import horovod.torch as hvd
    from horovod.torch.optimizer import _DistributedOptimizer

    # (the watcher's own hooks leave these steps to :func:`_step`)
    _DistributedOptimizer._rankwise_steps_itself = True
    patch(_DistributedOptimizer, "step", lambda original: _step(watcher, original))
    patch(hvd, "broadcast_optimizer_state", lambda original: _not_a_step(watcher, original))
    watcher.facts["api"] = "horovod"


def _not_a_step(watcher: WatcherView, original: Callable[..., Any]) -> Callable[..., Any]:
    """``hvd.broadcast_optimizer_state`` steps a fresh optimizer once with zero gradients, to create
    the state it broadcasts: not a training step (the watcher leaves it alone, in every run
    alike)."""

    def broadcast(*args: Any, **kwargs: Any) -> Any:
        with watcher.step_watch.runtime_step():
            return original(*args, **kwargs)

    return broadcast


def _compression(optimizer: _DistributedOptimizer) -> str:
    from horovod.torch.compression import FP16Compressor

    return (
        "horovod_fp16_compression"
        if getattr(optimizer, "_compression", None) is FP16Compressor
        else "none"
    )


def _step(watcher: WatcherView, original: Callable[..., Any]) -> Callable[..., Any]:
    def step(optimizer: _DistributedOptimizer, closure: Callable[[], object] | None = None) -> Any:
        if optimizer._should_synchronize:
            profile = watcher.window.profile
            with profile.mark("exchange") if profile is not None else contextlib.nullcontext():
                # what Horovod's step does first: the averaged gradients are in .grad now
                optimizer.synchronize()
        watcher.calls.name_exchange(_compression(optimizer))
        optimizer._rankwise_watch_now = True
        try:
            watcher._before_step(optimizer, (), {})
        finally:
            optimizer._rankwise_watch_now = False
        with optimizer.skip_synchronize():  # (averaged already: no second exchange)
            result = original(optimizer, closure)
        optimizer._rankwise_watch_now = True
        try:
            watcher._after_step(optimizer, (), {})
        finally:
            optimizer._rankwise_watch_now = False
        return result

    return step
