"""One optimizer step at a time: the step's record (its samples, losses, random draws, learning
rates, hyper-parameters and schedulers' state, gradient difference), the replicas' weights compared
across ranks, and the step count.

What a step is comes from elsewhere: torch's optimizer hooks (:mod:`rankwise.tools.watch.watcher`),
a Runtime's ``rt.step`` (:mod:`rankwise.tools.watch.runtime`), a framework's own step
(``deepspeed_engine``, ``horovod_optimizer``).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from rankwise.sampling.samples import sample_digests
from rankwise.tools.step_trace import RandomOps, StepRecord, generator_state, learning_rates
from rankwise.tools.watch.hyperparameters import hyperparameters, schedulers
from rankwise.tools.watch.ranks import gather, rank_and_world
from rankwise.tools.watch.reduction import summed_over_batch


class StepWatch:
    def __init__(self) -> None:
        self.step = 0
        """Optimizer steps taken."""
        self.record = StepRecord()
        """What this rank saw in the step under way."""
        self.replicas_differ: list[int] = []
        """The steps after which the ranks' replicated weights differed."""
        self.in_runtime_step = False
        """Inside a step another part reports (``rt.step``, a framework's): torch's hooks see its
        inner optimizer."""
        self.runtime_loss = False
        """The Runtime reported the loss of the backward about to run (``rt.backward``: a strategy
        may scale it)."""
        self.summed_loss: str | None = None
        """How the first loss summed over its batch was summed (None: none was; a Runtime's
        ``rt.backward`` loss is the strategy's to scale, and not judged)."""
        self.first_inputs: list[str] = []
        """The first training forward's input digests (its first 8 rows) where no DataLoader batch
        fed it: the sharding check of a script that makes its own batches."""
        self._inputs: list[str] = []
        self._random: RandomOps | None = None
        self._state: list[torch.Tensor] | None = None
        self._depth = 0

    # -- what the parts that see a step report ---------------------------------------------------

    def count_step(self) -> int:
        """An optimizer step ended: the steps taken so far."""
        self.step += 1
        return self.step

    def runtime_step_begins(self) -> None:
        """A step another part reports begins (``rt.step``, a framework's): torch's hooks will see
        its inner optimizer, which is not the script's step."""
        self.in_runtime_step = True

    def runtime_step_ends(self) -> None:
        self.in_runtime_step = False

    @contextlib.contextmanager
    def runtime_step(self) -> Iterator[None]:
        """Around a step another part takes (``with watcher.step_watch.runtime_step():``)."""
        self.runtime_step_begins()
        try:
            yield
        finally:
            self.runtime_step_ends()

    def runtime_backward(self, loss: float) -> None:
        """The Runtime reports the loss of the backward about to run (a strategy may scale it):
        recorded as the step's loss, and not judged as the script's own."""
        self.record.losses.append(loss)
        self.runtime_loss = True

    def mark_followed(self) -> None:
        """The step applied the N-rank run's gradient (a following reference)."""
        self.record.followed = True

    # -- forward, backward -------------------------------------------------------------------------

    def forward_begins(self) -> bool:
        """A module's forward begins: whether it is the outermost one (a model's, not a
        submodule's)."""
        self._depth += 1
        return self._depth == 1

    def forward_ends(self) -> bool:
        self._depth = max(0, self._depth - 1)
        return self._depth == 0

    def find_random_ops(self, module: nn.Module) -> None:
        """Locate the random operations this model's first training forward calls (a following
        run)."""
        if self._random is not None or hasattr(module.forward, "_torchdynamo_orig_callable"):
            return
        self._random = RandomOps(module)
        self._random.__enter__()
        # (its module hooks start after this module's own pre-hooks ran: the model itself goes on by
        # hand)
        self._random.stack.append(self._random.names.get(id(module), ""))

    def forward_inputs(self, args: tuple[Any, ...]) -> None:
        """The outermost training forward's positional inputs: one digest per row, kept for the
        backward that consumes them (used where no DataLoader batch was consumed)."""
        self._inputs += sample_digests(args)

    def batch_yielded(self) -> None:
        # did the forward draw random numbers? (compared at its backward)
        self._state = generator_state()

    def backward(
        self, loss: torch.Tensor, consumed: tuple[list[str], int | None] | None, tracing: bool
    ) -> None:
        """A backward on ``loss``, of the batch it ``consumed`` (its digests and tokens);
        ``tracing``: its loss read back (a device sync) and its random draws."""
        if self.summed_loss is None and not self.runtime_loss and loss.grad_fn is not None:
            self.summed_loss = summed_over_batch(loss, len(consumed[0]) if consumed else None)
        if consumed:
            digests, tokens = consumed
            self.record.samples += digests
            if tokens is not None:
                self.record.tokens.append(tokens)
        elif self._inputs:
            # (a batch the script made itself: its inputs are what the runs' data is known by)
            self.record.inputs += self._inputs
            if not self.first_inputs:
                self.first_inputs = self._inputs[:8]
        self._inputs = []
        if not tracing:
            return
        if self._random is not None:
            self._random.__exit__(None, None, None)
            for key, count in self._random.found.items():
                self.record.random_ops[key] = self.record.random_ops.get(key, 0) + count
            self._random = None
        # (rt.backward reported the loss the script gave it)
        if loss.numel() == 1 and not self.runtime_loss:
            self.record.losses.append(float(loss.detach().float()))
        self.runtime_loss = False
        if self._state is not None:
            self.record.random_draws += any(
                not torch.equal(a, b) for a, b in zip(self._state, generator_state(), strict=True)
            )
            self._state = None

    # -- the optimizer step ------------------------------------------------------------------------

    def begins(self, optimizer: object, no_grad: list[str], tracing: bool = True) -> None:
        """Between the step's last backward and its optimizer step: ``no_grad``, the trainable
        parameters without a gradient (kept in a one-process run); ``tracing``: the optimizer's
        settings too (~0.1 ms a step, not in a benchmark's timed steps)."""
        self.record.learning_rates = learning_rates(optimizer)
        if tracing:
            # (what the optimizer is told to do in this step: compared exactly with the other run's)
            self.record.hyperparameters = hyperparameters(optimizer)
            self.record.schedulers = schedulers(optimizer)
        if rank_and_world()[1] == 1:
            self.record.no_grad = no_grad

    def compared(
        self, parameters: list[torch.Tensor], compare: bool, sharded: bool
    ) -> list[dict[str, Any]]:
        """After the step: every rank's record where ``compare`` (a collective), with its replica's
        digest, else this rank's; where the replicas' digests differ (and the optimizer state is not
        ``sharded``), noted."""
        local = hashlib.blake2b(digest_size=8)
        if compare:  # (each costs a copy of the weights to the CPU)
            for parameter in parameters:
                if not hasattr(parameter, "full_tensor"):
                    local.update(
                        parameter.detach()
                        .cpu()
                        .contiguous()
                        .reshape(-1)
                        .view(torch.uint8)
                        .numpy()
                        .tobytes()
                    )
        record = self.record.as_dict() | {"weights_digest": local.hexdigest()}
        # Why: rank 0 writes what every rank saw in this step, and every rank's replica digest (a
        # benchmark compares the replicas after its first step only, and gathers nothing else until
        # its last).
        records = gather(record) if compare else [record]
        if len({r["weights_digest"] for r in records}) > 1 and not sharded:
            self.replicas_differ.append(self.step)
        return records

    def next(self) -> None:
        self.record = StepRecord()
