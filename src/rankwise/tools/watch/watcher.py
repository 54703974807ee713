"""Hooks on torch itself that record what a training script does, rank by rank, without touching the
script.

What it watches, and how:

* every optimizer step: torch's global optimizer step hooks.  Before the step, the gradient every
  parameter holds (what the ranks' exchange left there, gathered whole where parameters are
  DTensors); after it, the weights.  Parameters are named from the models the script ran forward. In
  a script on ``rankwise.setup()`` the Runtime's steps instead, with its strategy's whole gradients
  and weights (:mod:`rankwise.tools.watch.runtime`).
* every batch a ``DataLoader`` yields (:mod:`rankwise.tools.watch.loaders`): one digest per sample,
  assigned to the optimizer step whose backward consumed it.
* every ``backward`` (the loss value) and whether the forward moved the random generator.
* the collectives the script calls itself (:mod:`rankwise.tools.watch.calls`) and ``torch.save``
  (:mod:`rankwise.tools.watch.saves`).

Dropout modules are switched off (p=0) the first time a model runs forward, unless asked to keep
them. A ``follow`` directory makes a one-process reference follow the N-rank run in lockstep
(:mod:`rankwise.tools.watch.lockstep`), on the N ranks' samples (``scale``: N).

Each concern is a part with its own state: the models and their facts
(:mod:`~rankwise.tools.watch.models`), the data (:mod:`~rankwise.tools.watch.loaders`), the step and
its gradients (:mod:`~rankwise.tools.watch.step_watch`), the script's collectives and sync points
(:mod:`~rankwise.tools.watch.calls`), its saves (:mod:`~rankwise.tools.watch.saves`), the trace
written and followed (:mod:`~rankwise.tools.watch.lockstep`) and the timed window
(:mod:`~rankwise.tools.watch.window`); the watcher installs the hooks and tells each part what
happened. Its settings come parsed (:class:`~rankwise.tools.watch.settings.WatchSettings`); every
attribute of torch (or of a framework) it replaces is recorded in :mod:`rankwise.compat`.

After its last traced step (``watched_steps``) the watcher ends the script (``after="stop"``: a
reference, a benchmark), or lets it go on through the rest of its work untraced: its later epochs,
evaluation, saves and shutdown, which the findings that need no reference read.  ``after="shorten"``
cuts every later training pass to two optimizer steps' batches
(:meth:`~rankwise.tools.watch.loaders.LoaderWatch.shorten`) so the rest takes bounded time;
``after="as-written"`` runs it as the script wrote it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.optim.optimizer as optimizers
from torch import nn

from rankwise.runtime import observers
from rankwise.tools.watch import hyperparameters, seen, stall
from rankwise.tools.watch.calls import CallWatch
from rankwise.tools.watch.loaders import LoaderWatch
from rankwise.tools.watch.lockstep import Lockstep, take
from rankwise.tools.watch.models import ModelWatch, new_facts
from rankwise.tools.watch.ranks import assign, patch, rank_and_world, whole
from rankwise.tools.watch.saves import SaveWatch
from rankwise.tools.watch.settings import WatchSettings
from rankwise.tools.watch.step_watch import StepWatch
from rankwise.tools.watch.window import Window, report

if TYPE_CHECKING:
    from rankwise.runtime import Runtime

STEPS_KEPT = 2
"""Optimizer steps' worth of batches each training pass keeps after the window
(``after="shorten"``): two, so a pass still steps more than once (a defect of the step after an
epoch's first shows)."""


REPLICAS_EVERY = 5
"""After verify's window, the replicas are compared every this many optimizer steps."""


class WatchDone(observers.Finished):
    """The watcher recorded its last step: the script ends here, successfully, on every rank (a
    Runtime, where the script has one, closes as at the end of its loop)."""


class Watcher:
    def __init__(self, settings: WatchSettings) -> None:
        self.settings = settings
        self.facts = new_facts(settings.keep_dropout)
        """What the run is (``facts.json``): the models', and what the Runtime or the framework's
        adapter says."""
        self.models = ModelWatch(self.facts, settings.keep_dropout)
        self.step_watch = StepWatch()
        self.calls = CallWatch(lambda: self.step_watch.step)
        self.data = LoaderWatch(
            scale=settings.scale,
            follow=settings.follow,
            on_batch=self._batch_yielded,
            digest_all=settings.trace,
            collectives=lambda: (
                self.calls.calls,
                self.calls.deduplicated,
                self.calls.gathered.trimmed,
            ),
        )
        self.saves = SaveWatch(lambda: self.step_watch.step)
        self.lockstep = Lockstep(settings.directory, settings.follow)
        self.window = Window(settings)
        self.window_over = False
        """The traced window is over and the script goes on (``after`` is not "stop")."""
        self.on_shorten: list[Callable[[], None]] = []
        """Called when the later training passes are cut (a framework that counts an epoch's batches
        adapts)."""
        self.ended_by = "watcher"
        """How the script ended: ``"watcher"`` (at its last traced step), ``"script"`` (its
        ``__main__`` returned) or ``"failure"`` (it raised)."""
        self.runtime: Runtime | None = None
        """The script's Runtime, where it runs on ``rankwise.setup()``
        (:mod:`rankwise.tools.watch.runtime`): its steps, and the strategy's whole gradients and
        weights, instead of torch's optimizer hooks."""

    @property
    def step(self) -> int:
        return self.step_watch.step

    @property
    def tracing(self) -> bool:
        """Whether this step is traced: weights, gradients and lockstep (a trace, within its
        window)."""
        return self.settings.trace and not self.window_over

    # -- installation ------------------------------------------------------------------------------

    def install(self) -> None:
        optimizers.register_optimizer_step_pre_hook(self._before_step)
        optimizers.register_optimizer_step_post_hook(self._after_step)
        nn.modules.module.register_module_forward_pre_hook(self._forward)
        nn.modules.module.register_module_forward_hook(self._forward_done)
        patch(torch.Tensor, "backward", self._backward)
        self.data.install()
        self.calls.install()
        self.saves.install()
        hyperparameters.install()
        profile = self.window.profile
        if profile is not None:
            self.calls.mark_reads_with(lambda site: profile.mark(f"sync {site}"))
        # (it drives this watcher: imported here, not at the top)
        from rankwise.tools.watch.runtime import RuntimeSteps

        observers.register(RuntimeSteps(self))

    def _batch_yielded(self) -> None:
        stall.progress()
        if self.settings.trace:
            self.step_watch.batch_yielded()

    # -- forward, backward -------------------------------------------------------------------------

    def _forward(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if not self.step_watch.forward_begins():
            return
        stall.progress()
        self.window.begin("forward")
        if self.models.new(module):
            self.model_seen(module)
        if self.tracing and torch.is_grad_enabled() and not self.data.batch_waiting():
            # (a batch no DataLoader yielded: the model's inputs are what its data is known by)
            self.step_watch.forward_inputs(args)
        if not self.settings.trace and not self.step and torch.is_grad_enabled():
            self.window.flops.start(module, self.facts["device"])
        if self.lockstep.follow is not None and not self.step and torch.is_grad_enabled():
            self.step_watch.find_random_ops(module)

    def _forward_done(self, module: nn.Module, args: tuple[Any, ...], output: object) -> None:
        if self.step_watch.forward_ends():
            self.window.end_of("forward")

    def model_seen(self, model: nn.Module) -> None:
        """A model's first forward (before it runs): dropout off, its facts, its parameters' names;
        the first model's step-0 weights."""
        self.calls.patch_frameworks()  # (the script has imported its framework by now)
        first = not self.models.refs
        named = self.models.seen(model)
        if self.settings.trace and first and not self.step and not any(p.is_meta for _, p in named):
            self.lockstep.start(named)  # (a model built on the meta device has no weights yet)

    def _backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watcher = self

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            watcher._backward_seen(tensor)
            profile = watcher.window.profile
            with profile.mark("backward") if profile is not None else contextlib.nullcontext():
                return original(tensor, *args, **kwargs)

        return backward

    def _backward_seen(self, loss: torch.Tensor) -> None:
        stall.progress()
        self.calls.metrics.loss_seen(loss)
        # (a benchmark, or after verify's window: no loss read back, a device sync)
        self.step_watch.backward(loss, self.data.consume(), self.tracing)

    # -- optimizer steps ---------------------------------------------------------------------------

    @staticmethod
    def _is_wrapper(optimizer: object) -> bool:
        """A framework's optimizer around a torch one (whose own step the hooks see), or one whose
        framework's adapter watches its step itself (Horovod's:
        :mod:`rankwise.tools.watch.horovod_optimizer`)."""
        return isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer) or (
            getattr(optimizer, "_rankwise_steps_itself", False)
            and not getattr(optimizer, "_rankwise_watch_now", 0)
        )

    def _before_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if self._is_wrapper(optimizer) or self.step_watch.in_runtime_step:
            return None
        closure = kwargs.get("closure", args[0] if args and callable(args[0]) else None)
        if closure is None:
            self._gradients_ready(optimizer)
            return None
        # A step given a closure (Lightning's automatic optimization: optimizer.step(closure=...))
        # runs the forward and backward inside it, after this hook: the gradients are there once
        # the closure has run, so that is where this step begins.
        ready = False

        def closed() -> object:
            nonlocal ready
            loss = closure()
            if not ready:  # (LBFGS calls it again and again: the first backward is the step's)
                ready = True
                self._gradients_ready(optimizer)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closed}
        return (closed, *args[1:]), kwargs

    def _gradients_ready(self, optimizer: torch.optim.Optimizer) -> None:
        named = self.models.parameters(optimizer)
        self.step_begins(
            optimizer, [name for name, p in named if p.requires_grad and p.grad is None]
        )
        if not self.tracing:
            return
        # Why: where parameters are sharded DTensors, each rank's part of the whole gradient.
        applied = self.exchange({name: whole(p.grad) for name, p in named if p.grad is not None})
        if applied is None:
            return
        # This one process steps with the N-rank gradient, from the N-rank weights: the weights
        # after the step must match what the N-rank optimizer did with it (rounding aside).
        for name, parameter in named:
            if name in applied:
                if parameter.grad is None:
                    parameter.grad = torch.zeros_like(parameter)
                assign(parameter.grad, applied[name])
        self.step_watch.mark_followed()

    def step_begins(self, optimizer: object, no_grad: list[str]) -> None:
        """Between a step's last backward and its optimizer step: ``no_grad``, the trainable
        parameters without a gradient (kept in a one-process run)."""
        if not self.step:
            self.window.flops.stop()
        self.window.begin("optimizer")
        self.step_watch.begins(optimizer, no_grad, self.tracing)

    def exchange(self, gradients: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """Lockstep's gradient of the step under way
        (:meth:`~rankwise.tools.watch.lockstep.Lockstep.exchange`)."""
        return self.lockstep.exchange(self.step + 1, gradients, self.step_watch.record)

    def _after_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self._is_wrapper(optimizer) or self.step_watch.in_runtime_step:
            return
        named = self.models.parameters(optimizer)
        # (a collective for sharded parameters)
        self.step_ends(
            [p for _, p in named],
            lambda: {name: whole(p) for name, p in named},
            lambda theirs: take(named, theirs),
        )

    def step_ends(
        self,
        parameters: list[torch.Tensor],
        weights: Callable[[], dict[str, torch.Tensor]],
        follow: Callable[[dict[str, torch.Tensor]], None],
    ) -> None:
        """After an optimizer step (every rank): the step's record, the replicas compared, the
        weights written (a trace), lockstep's weights taken, and at the last step the report.
        ``weights()``: the whole weights by name (every rank calls it); ``follow(theirs)``: start
        the next step from the N-rank run's weights."""
        stall.progress()
        step_watch, settings = self.step_watch, self.settings
        step_watch.count_step()
        if rank_and_world()[1] > 1:
            self.calls.in_group(*rank_and_world())
        now = self.window.stepped(
            step_watch.step,
            len(step_watch.record.samples),
            self.calls.take_collective_seconds(),
            self.data.take_wait_seconds(),
        )
        # The replicas' weights, compared across ranks: every traced step, a benchmark's first,
        # every REPLICAS_EVERY-th after verify's window.
        compare = (
            self.tracing
            or step_watch.step == 1
            or (self.window_over and step_watch.step % REPLICAS_EVERY == 0)
        )
        records = step_watch.compared(parameters, compare, self.facts["shards_optimizer_state"])
        if self.tracing:
            whole_weights = weights()
            if rank_and_world()[0] == 0:
                if self.runtime is None:  # (a Runtime's strategy named its hook as the user set it)
                    self.facts["comm_hook"] = self.calls.comm_hook
                self.lockstep.write(step_watch.step, records, whole_weights, self.facts)
            theirs = self.lockstep.weights_after(step_watch.step)
            if theirs is not None:
                follow(theirs)  # lockstep: the next step starts from the N-rank run's weights
        step_watch.next()
        if step_watch.step < self.window.end or self.window_over:
            return
        if not settings.trace and self.window.goes_on(step_watch.step, now):
            return
        self.finish()
        if settings.trace and settings.after != "stop":
            self.window_over = True  # the script goes on, untraced, through the rest of its work
            # (the findings read each pass's first samples and its counts)
            self.data.digest_first_only()
            if settings.after == "shorten":
                self.data.shorten(
                    STEPS_KEPT * max(1, round(self.data.consumed_batches / step_watch.step))
                )
                for adapt in self.on_shorten:
                    adapt()
            return
        raise WatchDone()

    def finish(self, script_ended: bool = False) -> None:
        """Report the timed window (every rank; rank 0 writes ``probe.json``).  ``script_ended``:
        the script's loop ended after the steps asked, before the window's end: the window it
        had."""
        report(self, script_ended)

    # -- what the script does around the steps -----------------------------------------------------

    def write_rank_record(self) -> None:
        """What this rank saw, for the findings that need no reference
        (:func:`rankwise.tools.watch.seen.of`)."""
        seen.write(self)
