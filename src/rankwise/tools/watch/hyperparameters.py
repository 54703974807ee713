"""What the optimizer was told to do in a step: every parameter group's hyper-parameters and the
state of every learning-rate scheduler that drives it, recorded before each optimizer step.

``rankwise verify`` compares them exactly, step by step, between the N-rank run and the one process
(:mod:`rankwise.tools.verify.hyperparameter_diff`): a learning rate, a beta or a scheduler's step
count that differs is a cause of its own, however small the weights' difference it makes (a whole
Adam step at lr 2e-7 moves a weight by about 2e-7).

Schedulers are found as torch builds them: every ``torch.optim.lr_scheduler.LRScheduler`` (and
``ReduceLROnPlateau``, which does not call its base's ``__init__``) registers itself when it is
built (:data:`SCHEDULERS`, weakly held); a scheduler drives an optimizer when its ``optimizer`` is
that optimizer, or a framework's wrapper around it (``AcceleratedOptimizer.optimizer``, DeepSpeed's
ZeRO optimizer's ``optimizer``).  Accelerate's ``AcceleratedScheduler`` is not one: the torch
scheduler it wraps is, and its state is what the wrapper's stepping changed.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.optim import lr_scheduler

from rankwise.tools.watch.ranks import patch

SCHEDULERS: weakref.WeakKeyDictionary[lr_scheduler.LRScheduler, int] = weakref.WeakKeyDictionary()
"""Every torch learning-rate scheduler built in this process (since :func:`install`), with the order
it was built in."""
_built = itertools.count()

_DEPTH = 4
"""How many ``.optimizer`` wrappers deep an optimizer is unwrapped (Accelerate's around torch's,
DeepSpeed's around its basic optimizer)."""

Scalar = bool | int | float | str | None | list["Scalar"]
"""A setting as the trace holds it: a number, a flag, a word, or a list of them."""


def install() -> None:
    """Register every scheduler the script builds from now on."""
    for owner in (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau):
        patch(owner, "__init__", _registering)


def _registering(original: Callable[..., Any]) -> Callable[..., Any]:
    def init(scheduler: lr_scheduler.LRScheduler, *args: Any, **kwargs: Any) -> None:
        original(scheduler, *args, **kwargs)
        # (a subclass's __init__ runs its base's first: registered once)
        SCHEDULERS.setdefault(scheduler, next(_built))

    return init


def _scalar(value: object) -> Scalar:
    """``value`` as JSON holds it when it is a number, a flag, a word or a list of them (a tensor of
    one element as its number), else ``None`` (not recorded)."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_scalar(item) for item in value]
        return items if all(i is not None or v is None for i, v in zip(items, value)) else None
    return None


def _scalars(
    mapping: Mapping[str, object], leave: frozenset[str] = frozenset()
) -> dict[str, Scalar]:
    kept: dict[str, Scalar] = {}
    for key, value in mapping.items():
        if key in leave:
            continue
        scalar = _scalar(value)
        if scalar is not None or value is None:
            kept[key] = scalar
    return kept


def hyperparameters(optimizer: object) -> list[dict[str, Scalar]]:
    """Each parameter group's scalar settings (``lr``, ``betas``, ``eps``, ``weight_decay``,
    ``momentum``, ``initial_lr`` a scheduler added, any other scalar key), its parameters left
    out."""
    return [
        _scalars(group, frozenset({"params"})) for group in getattr(optimizer, "param_groups", [])
    ]


def _chain(optimizer: object) -> set[int]:
    """The ids of an optimizer and of every optimizer it wraps (``.optimizer``)."""
    found: set[int] = set()
    for _ in range(_DEPTH):
        if optimizer is None:
            break
        found.add(id(optimizer))
        optimizer = getattr(optimizer, "optimizer", None)
    return found


def schedulers(optimizer: object) -> list[dict[str, Scalar]]:
    """The state of every scheduler that drives ``optimizer`` (its ``state_dict()``'s scalars and
    lists of scalars: ``last_epoch``, ``_step_count``, ``base_lrs``, ``_last_lr``, a schedule's own
    settings), with its class as ``"scheduler"``, in the order they were built."""
    mine = _chain(optimizer)
    found: list[dict[str, Scalar]] = []
    for scheduler, _ in sorted(SCHEDULERS.items(), key=lambda item: item[1]):
        if mine & _chain(getattr(scheduler, "optimizer", None)):
            named: dict[str, Scalar] = {"scheduler": type(scheduler).__name__}
            found.append(named | _scalars(scheduler.state_dict()))
    return found
