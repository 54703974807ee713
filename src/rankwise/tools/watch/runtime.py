"""The watcher in a script on ``rankwise.setup()``: the Runtime's steps, and the strategy's whole
state.

The watcher is one probe for every script.  In a script on ``rankwise.setup()`` it watches torch as
in any other (its DataLoaders, backward passes, collectives, ``torch.save``) and also listens to the
script's Runtime (:mod:`rankwise.runtime.observers`), because there torch's optimizer hooks are not
the step: DeepSpeed steps an inner optimizer over flattened partitions, Horovod averages the
gradients inside its optimizer's ``step``.  So here:

* a step is ``rt.step`` (a plain ``optimizer.step()`` the strategy allows is watched as in any
  script): the gradients are the strategy's whole ones (``full_gradients``: gathered where they are
  sharded, unscaled), the weights after it ``rt.state_dict`` (whole, by name, buffers included);
* the loss is what the script gave ``rt.backward`` (a strategy may scale it before its own
  backward), or what a plain ``loss.backward()`` ran on;
* the model is seen as ``rt.prepare`` received it, before the strategy wraps it: dropout off, step
  0's weights, and a following run's start from the N-rank run's;
* the one-process reference takes its own samples: the Runtime gives it the N ranks' global batch
  already.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from rankwise.runtime import observers
from rankwise.tools.step_trace import uses_tf32

if TYPE_CHECKING:
    from rankwise.runtime import Runtime
    from rankwise.tools.watch.watcher_view import WatcherView


class RuntimeSteps(observers.Observer):
    def __init__(self, watcher: WatcherView) -> None:
        self.watcher = watcher

    def prepared(self, rt: Runtime, model: nn.Module, grad_accum: int) -> None:
        watcher = self.watcher
        watcher.runtime = rt
        # the Runtime's loaders give one process the N ranks' global batches themselves
        watcher.data.batches_from_runtime()
        watcher.model_seen(model)
        watcher.facts.update(
            {
                "api": "rankwise",
                "strategy": rt.strategy_name,
                "precision": rt.strategy.precision.name,
                "device": rt.device.type,
                "tf32": watcher.facts["tf32"] or uses_tf32(model, rt.device),
                "comm_hook": str(getattr(rt.strategy.options, "comm_hook", "none")),
                "shards_optimizer_state": rt.strategy.shards_optimizer_state,
            }
        )

    def backward(self, rt: Runtime, loss: torch.Tensor) -> None:
        if self.watcher.settings.trace:
            self.watcher.step_watch.runtime_backward(float(loss.detach().float().sum()))

    def before_step(self, rt: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        watcher = self.watcher
        watcher.step_watch.runtime_step_begins()
        no_grad = [
            name
            for name, p in rt.strategy.unwrap(model).named_parameters()
            if p.requires_grad and p.grad is None
        ]
        watcher.step_begins(optimizer, no_grad)
        if not watcher.tracing:
            return
        # a collective where gradients are sharded
        applied = watcher.exchange(rt.strategy.full_gradients(model))
        if applied is None:
            return
        # The step applies the N-rank gradient: with the same weights and optimizer state before it,
        # the weights after it must match whatever the N-rank optimizer did with it, to rounding.
        # (Both are unscaled: under a 16-bit loss scale this run's own scale goes back on, for its
        # step to take off.)
        scale = rt.strategy.gradient_scale()
        for name, param in rt.strategy.unwrap(model).named_parameters():
            grad = applied.get(name)
            param.grad = (
                None
                if grad is None
                else (grad.reshape(param.shape) * scale).to(param.device, param.dtype)
            )
        watcher.step_watch.mark_followed()

    def stepped(self, rt: Runtime, model: nn.Module) -> None:
        self.watcher.step_watch.runtime_step_ends()
        self.watcher.step_ends(
            list(rt.strategy.unwrap(model).parameters()),
            # a collective if sharded
            lambda: {k: v.detach().float().cpu() for k, v in rt.state_dict(model).items()},
            lambda theirs: rt.strategy.load_model_state_dict(model, theirs),
        )

    def ended(self, rt: Runtime) -> None:
        """The script's loop ended before the watcher's last step, its process group still open: a
        benchmark past its asked steps reports the window it had (every rank)."""
        watcher = self.watcher
        if (
            not watcher.settings.trace
            and not watcher.window.reported
            and watcher.window.started is not None
            and watcher.step >= watcher.settings.watched_steps
        ):
            watcher.finish(script_ended=True)
