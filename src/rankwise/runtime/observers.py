"""What a tool may watch in a Runtime, without the library knowing the tool.

``rankwise verify`` and ``rankwise bench --script`` start each rank of a script on
``rankwise.setup()`` through a bootstrap of their own, which registers an :class:`Observer` before
the script runs; every Runtime the script then creates calls it at the points below.  Nothing is
registered in an ordinary run, and the calls cost a loop over an empty list.
"""

from __future__ import annotations

import torch
from torch import nn

_registered: list[Observer] = []


class Finished(SystemExit):
    """Raised by an observer to end the script on every rank, successfully, at the same step (a
    benchmark's or a comparison's last one): the Runtime closes cleanly, as at the end of the
    script's loop."""

    def __init__(self):
        super().__init__(0)


class Observer:
    """The points of a training loop a Runtime reports (each a no-op here: an observer overrides
    what it needs).

    Every method is called on every rank at the same point of the loop, so an observer may use
    collectives in those that say so."""

    def prepared(self, rt, model: nn.Module, grad_accum: int) -> None:
        """``rt.prepare``, before the strategy wraps ``model`` (every rank: collectives allowed)."""

    def loader(self, rt, global_batch: int, shuffle: bool) -> None:
        """``rt.loader`` built a loader of ``global_batch`` samples a step (``shuffle``: a training
        loader)."""

    def batch(self, rt, batch) -> None:
        """``rt.to_device`` moved ``batch`` (the rank's part of a micro-batch)."""

    def backward(self, rt, loss: torch.Tensor) -> None:
        """``rt.backward(loss)``, before the backward pass."""

    def before_step(self, rt, model: nn.Module, optimizer) -> None:
        """Between the step's last backward and its optimizer step (every rank: collectives
        allowed)."""

    def stepped(self, rt, model: nn.Module) -> None:
        """After optimizer step ``rt.steps`` (every rank: collectives allowed); may raise
        :class:`Finished`."""

    def ended(self, rt) -> None:
        """The script's ``with rankwise.setup()`` block ended without an error (every rank)."""


def register(observer: Observer) -> None:
    """Watch every Runtime created in this process from now on."""
    _registered.append(observer)


def registered() -> list[Observer]:
    return list(_registered)


def unregister(observer: Observer) -> None:
    """Stop watching Runtimes created from now on with ``observer`` (a tool that watched one script
    in its own process: ``rankwise plan``)."""
    if observer in _registered:
        _registered.remove(observer)
