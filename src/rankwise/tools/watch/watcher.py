"""Hooks on torch itself that record what a training script does, rank by rank, without touching the script.

What it watches, and how:

* every optimizer step: torch's global optimizer step hooks.  Before the step, the gradient every
  parameter holds (what the ranks' exchange left there, gathered whole where parameters are
  DTensors); after it, the weights.  Parameters are named from the models the script ran forward.
  In a script on ``rankwise.setup()`` the Runtime's steps instead, with its strategy's whole gradients and
  weights (:mod:`rankwise.tools.watch.runtime`).
* every batch a ``DataLoader`` yields (:mod:`rankwise.tools.watch.loaders`): one digest per sample,
  assigned to the optimizer step whose backward consumed it.
* every ``backward`` (the loss value) and whether the forward moved the random generator.
* the collectives the script calls itself and ``torch.save`` (:mod:`rankwise.tools.watch.calls`).

Dropout modules are switched off (p=0) the first time a model runs forward, unless asked to keep them.
A ``follow`` directory makes a one-process reference follow the N-rank run in lockstep
(:mod:`rankwise.tools.trace`), on the N ranks' samples (``scale``: N).

After its last traced step (``steps``) the watcher ends the script (``after="stop"``: a reference, a benchmark), or
lets it go on through the rest of its work untraced: its later epochs, evaluation, saves and shutdown, which the
findings that need no reference read.  ``after="shorten"`` cuts every later training pass to two optimizer steps'
batches (:meth:`~rankwise.tools.watch.loaders.LoaderWatch.shorten`) so the rest takes bounded time;
``after="as-written"`` runs it as the script wrote it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import torch
import torch.optim.optimizer as optimizers
from torch import nn

from rankwise import observers
from rankwise.breakdown import StepProfile
from rankwise.checkpoint import read_weights, write_text_atomic, write_weights
from rankwise.throughput import MIN_WINDOW_S, window_end
from rankwise.tolerance import gradient_difference
from rankwise.tools.trace import (
    FACTS_FILE,
    TRACE_FILE,
    RandomOps,
    StepRecord,
    exchange_gradients,
    generator_state,
    learning_rates,
    model_facts,
    switch_off_dropout,
    uses_tf32,
    weights_file,
)
from rankwise.tools.watch import seen, stall, window
from rankwise.tools.watch.calls import CallWatch
from rankwise.tools.watch.flops import StepFlops
from rankwise.tools.watch.loaders import LoaderWatch
from rankwise.tools.watch.ranks import assign, gather, patch, rank_and_world, whole

WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_forward_module.", "_fsdp_wrapped_module.")
"""What wrappers (DDP, torch.compile, Fabric, FSDP1) put in front of a parameter's name."""


AFTER_WINDOW = ("stop", "shorten", "as-written")
"""What a watched run does after its last traced step (see the module's docstring)."""
STEPS_KEPT = 2
"""Optimizer steps' worth of batches each training pass keeps after the window (``after="shorten"``): two, so a
pass still steps more than once (a defect of the step after an epoch's first shows)."""


REPLICAS_EVERY = 5
"""After verify's window, the replicas are compared every this many optimizer steps."""


class WatchDone(observers.Finished):
    """The watcher recorded its last step: the script ends here, successfully, on every rank (a Runtime, where the
    script has one, closes as at the end of its loop)."""


class Watcher:
    def __init__(self, directory: str | Path, *, steps: int, warmup: int = 1, follow: str | Path | None = None,
                 scale: int = 1, keep_dropout: bool = False, trace: bool = True, min_window_s: float = MIN_WINDOW_S,
                 after: str = "stop", profile_steps: int = 0):
        self.directory, self.steps, self.warmup = Path(directory), steps, warmup
        self.follow = Path(follow) if follow else None
        self.scale, self.keep_dropout, self.trace = scale, keep_dropout, trace
        self.min_window_s = min_window_s
        if after not in AFTER_WINDOW:
            raise ValueError(f"after={after!r}: one of {', '.join(AFTER_WINDOW)}")
        self.after = after
        self.window_over = False
        """The traced window is over and the script goes on (``after`` is not "stop")."""
        self.consumed_batches = 0
        """Batches a backward consumed (in the window: its micro-batches per step)."""
        self.on_shorten: list[Callable[[], None]] = []
        """Called when the later training passes are cut (a framework that counts an epoch's batches adapts)."""
        self.ended_by = "watcher"
        """How the script ended: ``"watcher"`` (at its last traced step), ``"script"`` (its ``__main__`` returned) or
        ``"failure"`` (it raised)."""
        self.step = 0
        self.models: list[weakref.ref] = []
        self.names: dict[int, str] = {}
        self.data = LoaderWatch(scale=scale, follow=self.follow, on_batch=self._batch_yielded, digest_all=trace)
        self.calls = CallWatch(lambda: self.step)
        self.data.collectives = lambda: (self.calls.calls, self.calls.deduplicated)
        self.flops = StepFlops()
        """A benchmark's FLOPs of the first step (a warm-up step: the counter's cost stays outside the window)."""
        self.flops_samples = 0
        profile_steps = max(0, min(profile_steps, steps - warmup - 2))  # (fewer in a short run)
        self.profile = StepProfile(profile_steps) if profile_steps > 0 and not trace else None
        """A benchmark's step-time breakdown: ``profile_steps`` steps after its warm-up, profiled, on top of the steps
        asked, then its timed window (which the profiler's cost stays out of)."""
        if self.profile is not None:
            self.profile.after, self.warmup = warmup, warmup + profile_steps
        self.replicas_differ: list[int] = []
        self.facts = {"dropout": [], "dropout_kept": keep_dropout, "half_params": [], "batch_dependent": [],
                      "precision": "32-true", "device": "cpu", "comm_hook": "none", "tf32": False,
                      "shards_optimizer_state": False, "api": "torch"}
        self.started: float | None = None
        self.step_started = time.perf_counter()
        self.step_seconds: list[float] = []
        self.step_collective_seconds: list[float] = []
        self._random: RandomOps | None = None
        self._state: list[torch.Tensor] | None = None
        self._depth = 0
        self.timed_samples = 0
        self.end = max(steps, warmup + 1) + (self.profile.steps if self.profile else 0)  # (profiled: extra steps)
        """The step the watcher ends the script at: ``steps``, then (a benchmark) later if the window was short."""
        self.reported = False
        self.joined: tuple[int, int] | None = None
        """(rank, world size) while the script's process group was open (a script may close it before the end)."""
        self.runtime = None
        """The script's Runtime, where it runs on ``rankwise.setup()`` (:mod:`rankwise.tools.watch.runtime`): its
        steps, and the strategy's whole gradients and weights, instead of torch's optimizer hooks."""
        self.in_runtime_step = False
        """Inside ``rt.step``: the Runtime reports this step (torch's hooks see the strategy's inner optimizer)."""
        self.runtime_loss = False
        """The Runtime reported the loss of the backward about to run (``rt.backward``: a strategy may scale it)."""
        self._reset_step()

    @property
    def tracing(self) -> bool:
        """Whether this step is traced: weights, gradients and lockstep (a trace, within its window)."""
        return self.trace and not self.window_over

    def _reset_step(self) -> None:
        self.record = StepRecord()

    # -- installation ------------------------------------------------------------------------------------------

    def install(self) -> None:
        optimizers.register_optimizer_step_pre_hook(self._before_step)
        optimizers.register_optimizer_step_post_hook(self._after_step)
        nn.modules.module.register_module_forward_pre_hook(self._forward)
        nn.modules.module.register_module_forward_hook(self._forward_done)
        patch(torch.Tensor, "backward", self._backward)
        self.data.install()
        self.calls.install()
        if self.profile is not None:
            self.calls.region = lambda site: self.profile.mark(f"sync {site}")
        from rankwise.tools.watch.runtime import RuntimeSteps  # (it drives this watcher: imported here, not at the top)
        observers.register(RuntimeSteps(self))

    def _batch_yielded(self) -> None:
        stall.progress()
        if self.trace:
            self._state = generator_state()  # did the forward draw random numbers? (compared at its backward)

    # -- forward, backward -------------------------------------------------------------------------------------

    def _forward(self, module: nn.Module, args) -> None:
        self._depth += 1
        if self._depth != 1:
            return
        stall.progress()
        if self.profile is not None:
            self.profile.begin("forward")
        if not any(ref() is module for ref in self.models):
            self.model_seen(module)
        if not self.trace and not self.step and torch.is_grad_enabled():
            self.flops.start(module, self.facts["device"])
        if self.follow is not None and not self.step and self._random is None and torch.is_grad_enabled() \
                and not hasattr(module.forward, "_torchdynamo_orig_callable"):
            self._random = RandomOps(module)
            self._random.__enter__()
            # (its module hooks start after this module's own pre-hooks ran: the model itself goes on by hand)
            self._random.stack.append(self._random.names.get(id(module), ""))

    def _forward_done(self, module, args, output) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0 and self.profile is not None:
            self.profile.end("forward")

    def model_seen(self, model: nn.Module) -> None:
        """A model's first forward (before it runs): dropout off, its facts, its parameters' names."""
        self.models.append(weakref.ref(model))
        self.calls.patch_frameworks()  # (the script has imported its framework by now)
        facts = self.facts
        facts["dropout"] += switch_off_dropout(model, self.keep_dropout)
        facts["batch_dependent"] = sorted(set(facts["batch_dependent"]) | set(model_facts(model)["batch_dependent"]))
        parameters = list(model.parameters())
        facts["half_params"] = sorted(set(facts["half_params"]) | {
            str(p.dtype).removeprefix("torch.") for p in parameters
            if p.requires_grad and p.dtype in (torch.float16, torch.bfloat16)})
        if parameters:
            facts["device"] = parameters[0].device.type
            facts["tf32"] = facts["tf32"] or uses_tf32(model, parameters[0].device)
        facts["shards_optimizer_state"] = facts["shards_optimizer_state"] or any(
            hasattr(p, "full_tensor") for p in parameters)
        named = []
        for name, parameter in model.named_parameters():
            while name.startswith(WRAPPER_PREFIXES):
                name = name.split(".", 1)[1]
            name = name.replace("._orig_mod.", ".").replace("._fsdp_wrapped_module.", ".")
            self.names.setdefault(id(parameter), name)
            named.append((name, parameter))
        if self.trace and len(self.models) == 1 and not self.step and not any(p.is_meta for _, p in named):
            # Step 0: the first model's weights as the script built them (a collective for sharded ones); a
            # following run starts from the N-rank run's.  (A model built on the meta device has none yet.)
            weights = {name: whole(p) for name, p in named}
            if rank_and_world()[0] == 0:
                write_weights(weights, weights_file(self.directory, 0))
            if self.follow is not None and weights_file(self.follow, 0).exists():
                _take(named, read_weights(weights_file(self.follow, 0)))

    def _backward(self, original):
        watcher = self

        def backward(tensor, *args, **kwargs):
            watcher._backward_seen(tensor)
            with watcher.profile.mark("backward") if watcher.profile is not None else contextlib.nullcontext():
                return original(tensor, *args, **kwargs)
        return backward

    def _backward_seen(self, loss: torch.Tensor) -> None:
        stall.progress()
        consumed = self.data.consume()
        if consumed:
            self.consumed_batches += 1
            digests, tokens = consumed
            self.record.samples += digests
            if tokens is not None:
                self.record.tokens.append(tokens)
        if not self.tracing:  # a benchmark, or after verify's window: no loss read back (a device sync)
            return
        if self._random is not None:
            self._random.__exit__(None, None, None)
            for key, count in self._random.found.items():
                self.record.random_ops[key] = self.record.random_ops.get(key, 0) + count
            self._random = None
        if loss.numel() == 1 and not self.runtime_loss:  # (rt.backward reported the loss the script gave it)
            self.record.losses.append(float(loss.detach().float()))
        self.runtime_loss = False
        if self._state is not None:
            self.record.random_draws += any(not torch.equal(a, b) for a, b in zip(self._state, generator_state(),
                                                                            strict=True))
            self._state = None

    # -- optimizer steps ---------------------------------------------------------------------------------------

    @staticmethod
    def _is_wrapper(optimizer) -> bool:
        """A framework's optimizer around a torch one (whose own step the hooks see), or one whose framework's
        adapter watches its step itself (Horovod's: :mod:`rankwise.tools.watch.horovod_optimizer`)."""
        return isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer) or (
            getattr(optimizer, "_rankwise_steps_itself", False) and not getattr(optimizer, "_rankwise_watch_now", 0))

    def _parameters(self, optimizer) -> list[tuple[str, torch.Tensor]]:
        return [(self.names.get(id(parameter), f"group{g}.param{i}"), parameter)
                for g, group in enumerate(optimizer.param_groups) for i, parameter in enumerate(group["params"])]

    def _before_step(self, optimizer, args, kwargs) -> None:
        if self._is_wrapper(optimizer) or self.in_runtime_step:
            return
        named = self._parameters(optimizer)
        self.step_begins(optimizer, [name for name, p in named if p.requires_grad and p.grad is None])
        if not self.tracing:
            return
        # Why: where parameters are sharded DTensors, each rank's part of the whole gradient.
        applied = self.exchange({name: whole(p.grad) for name, p in named if p.grad is not None})
        if applied is None:
            return
        # This one process steps with the N-rank gradient, from the N-rank weights: the weights after the step
        # must match what the N-rank optimizer did with it (rounding aside).
        for name, parameter in named:
            if name in applied:
                if parameter.grad is None:
                    parameter.grad = torch.zeros_like(parameter)
                assign(parameter.grad, applied[name])
        self.record.followed = True

    def step_begins(self, optimizer, no_grad: list[str]) -> None:
        """Between a step's last backward and its optimizer step: ``no_grad``, the trainable parameters without a
        gradient (kept in a one-process run)."""
        if not self.step:
            self.flops.stop()
        if self.profile is not None:
            self.profile.begin("optimizer")
        self.record.learning_rates = learning_rates(optimizer)
        if rank_and_world()[1] == 1:
            self.record.no_grad = no_grad

    def exchange(self, gradients: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """Lockstep: the N-rank run writes its whole gradient; a following run gets it back (to step with) and keeps
        its own gradient's difference from it.  ``None`` where there is nothing to follow (any more)."""
        applied = exchange_gradients(self.directory, self.follow, self.step + 1, gradients, rank_and_world()[0] == 0)
        if applied is None:  # the N-rank run itself, or it ended before this step: from here on this run goes alone
            self.follow = None
            return None
        self.record.gradient = gradient_difference(applied, gradients)
        return applied

    def _after_step(self, optimizer, args, kwargs) -> None:
        if self._is_wrapper(optimizer) or self.in_runtime_step:
            return
        named = self._parameters(optimizer)
        # (a collective for sharded parameters)
        self.step_ends([p for _, p in named], lambda: {name: whole(p) for name, p in named},
                       lambda theirs: _take(named, theirs))

    def step_ends(self, parameters: list[torch.Tensor], weights: Callable[[], dict[str, torch.Tensor]],
                  follow: Callable[[dict[str, torch.Tensor]], None]) -> None:
        """After an optimizer step (every rank): the step's record, the replicas compared, the weights written (a
        trace), lockstep's weights taken, and at the last step the report.  ``weights()``: the whole weights by name
        (every rank calls it); ``follow(theirs)``: start the next step from the N-rank run's weights."""
        stall.progress()
        self.step += 1
        if self.profile is not None:
            self.profile.end("optimizer")
            self.profile.step_done()
        if rank_and_world()[1] > 1:
            self.joined = rank_and_world()
        now = time.perf_counter()
        self.step_seconds.append(now - self.step_started)
        self.step_collective_seconds.append(self.calls.collective_seconds)
        self.step_started, self.calls.collective_seconds = now, 0.0
        if self.step == 1:
            self.flops_samples = len(self.record.samples)
        if self.profile is not None and self.step == self.profile.after:
            # Why a barrier: it aligns the ranks' clocks for the arrival times, every rank at this same step.
            self.profile.start(lambda: gather(None))
        if self.step == self.warmup:
            self.started, self.timed_samples = now, 0
        elif self.started is not None:
            self.timed_samples += len(self.record.samples)
        local = hashlib.blake2b(digest_size=8)
        # The replicas' weights, compared across ranks: every traced step, a benchmark's first, every
        # REPLICAS_EVERY-th after verify's window (each costs a copy of the weights to the CPU).
        compared = self.tracing or self.step == 1 or (self.window_over and self.step % REPLICAS_EVERY == 0)
        if compared:
            for parameter in parameters:
                if not hasattr(parameter, "full_tensor"):
                    local.update(parameter.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
                                 .tobytes())
        record = self.record.as_dict() | {"weights_digest": local.hexdigest()}
        # Why: rank 0 writes what every rank saw in this step, and every rank's replica digest (a benchmark compares
        # the replicas after its first step only, and gathers nothing else until its last).
        records = gather(record) if compared else [record]
        if len({r["weights_digest"] for r in records}) > 1 and not self.facts["shards_optimizer_state"]:
            self.replicas_differ.append(self.step)
        rank, _ = rank_and_world()
        if self.tracing:
            whole_weights = weights()
            if rank == 0:
                write_weights(whole_weights, weights_file(self.directory, self.step))
                with open(self.directory / TRACE_FILE, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps({"step": self.step, "ranks": records}) + "\n")
                if self.runtime is None:  # (a Runtime's strategy named its hook as the user set it)
                    self.facts["comm_hook"] = self.calls.comm_hook
                write_text_atomic(self.directory / FACTS_FILE, json.dumps(self.facts, indent=2))
            if self.follow is not None and weights_file(self.follow, self.step).exists():
                # Lockstep: the next step starts from the N-rank run's weights, so rounding never compounds.
                follow(read_weights(weights_file(self.follow, self.step)))
        self._reset_step()
        if self.step < self.end or self.window_over:
            return
        if not self.trace and self.started is not None and self.step > self.warmup:
            # The end moves on, at the pace measured so far, until the window lasted min_window_s or reached its
            # most steps (the pace changes under load).
            # Why: every rank must stop at the same step, so rank 0's clock decides how long the window runs.
            self.end = gather(window_end(self.step, self.warmup, now - self.started, self.min_window_s))[0]
            if self.step < self.end:
                return
        self.finish()
        if self.trace and self.after != "stop":
            self.window_over = True  # the script goes on, untraced, through the rest of its work
            self.data.digest_all = False  # (the findings read each pass's first samples and its counts)
            if self.after == "shorten":
                self.data.shorten(STEPS_KEPT * max(1, round(self.consumed_batches / self.step)))
                for adapt in self.on_shorten:
                    adapt()
            return
        raise WatchDone()

    def finish(self, script_ended: bool = False) -> None:
        """Report the timed window (every rank; rank 0 writes ``probe.json``).  ``script_ended``: the script's loop
        ended after the steps asked, before the window's end: the window it had."""
        self.reported = True
        window.report(self, script_ended)

    # -- what the script does around the steps -----------------------------------------------------------------

    def write_rank_record(self) -> None:
        """What this rank saw, for the findings that need no reference (:func:`rankwise.tools.watch.seen.of`)."""
        seen.write(self)


def _take(named: list[tuple[str, torch.Tensor]], theirs: dict[str, torch.Tensor]) -> None:
    """Lockstep: each named parameter takes the N-rank run's weights (those it has)."""
    for name, parameter in named:
        if name in theirs:
            assign(parameter, theirs[name])
