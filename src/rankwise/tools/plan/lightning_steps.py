"""A model whose training step is a method, not its forward: Lightning's ``LightningModule``.

A Lightning ``Trainer`` never calls the model the optimizer trains for its training step: it calls
its ``training_step(batch, batch_idx)`` (through the DDP wrapper's forward where there is one:
Lightning's forward redirection), which runs the model's layers and returns the loss.  The capture
(:mod:`~rankwise.tools.plan.capture`) therefore watches that method on such a model (one with a
``training_step``), and what the plan replays is :class:`TrainingStep`: a module whose forward is
that method, over the same parameters, its output the loss (a tensor, or a dict with ``"loss"``).
Detected by the method, not by importing Lightning (the plan has no Lightning dependency).

After the capture the model is detached from its trainer (``model.trainer = None``, Lightning's
public setter): the plan copies the model, and a copy must not copy the trainer; a detached
``self.log(...)`` does nothing (Lightning's warning that it does is silenced).  A ``training_step``
that reads the trainer itself (``self.trainer.global_step``) cannot be replayed: the plan says so on
one line.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn


def has_training_step(model: nn.Module) -> bool:
    """Whether ``model``'s training step is its ``training_step`` method (a LightningModule)."""
    return callable(getattr(type(model), "training_step", None))


class TrainingStep(nn.Module):
    """``module.training_step`` as a module's forward (see the module's docstring)."""

    module: Any  # (a LightningModule: its training_step and trainer are its class's, not Module's)

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            # (a detached model's self.log does nothing, and Lightning says so at every call site)
            warnings.filterwarnings("ignore", message=r"You are trying to `self\.log")
            return self.module.training_step(*args, **kwargs)

    def detach(self) -> None:
        """Drop the module's trainer (Lightning's ``trainer`` setter), where it has one."""
        prop = getattr(type(self.module), "trainer", None)
        if isinstance(prop, property) and prop.fset is not None:
            self.module.trainer = None
