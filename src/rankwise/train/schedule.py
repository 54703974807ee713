"""When the training loop logs, checkpoints and evaluates: decisions by optimizer step, nothing
else.

``step`` is the number of optimizer steps taken, as the loop counts them right after a step: 1 after
the first. Step 0 (nothing trained yet) is never a step to act on.  Every decision depends on the
step alone, so a run resumed at step S acts at the same steps as an uninterrupted run from S on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    total_steps: int
    """The step training ends at (epochs x steps per epoch, or ``max_steps`` when that comes
    first)."""
    steps_per_epoch: int
    """Optimizer steps in one epoch (>= 1)."""
    log_every: int
    """Log the loss every N steps (and at the last step)."""
    save_every: int | None = None
    """Also checkpoint every N steps; None: only at epoch ends and ``save_at_steps``."""
    save_at_steps: frozenset[int] = frozenset()
    """Also checkpoint right after these steps."""
    evaluate_dev: bool = True
    """Evaluate the dev split at each epoch end (the run has a dev split and asks for it)."""

    def __post_init__(self):
        if (
            self.steps_per_epoch < 1
            or self.log_every < 1
            or (self.save_every is not None and self.save_every < 1)
        ):
            raise ValueError(f"steps_per_epoch, log_every and save_every must be >= 1: {self}")

    @classmethod
    def of(
        cls,
        *,
        total_steps: int,
        steps_per_epoch: int,
        log_every: int,
        save_every: int | None = None,
        save_at_steps: Iterable[int] = (),
        evaluate_dev: bool = True,
    ) -> Schedule:
        return cls(
            total_steps,
            steps_per_epoch,
            log_every,
            save_every,
            frozenset(save_at_steps),
            evaluate_dev,
        )

    def epoch_of(self, step: int) -> int:
        """The epoch the step after ``step`` trains in."""
        return step // self.steps_per_epoch

    def done(self, step: int) -> bool:
        return step >= self.total_steps

    def should_log(self, step: int) -> bool:
        """Log (all-reduce) the loss after ``step``: every ``log_every`` steps and at the last
        one."""
        return step > 0 and (step % self.log_every == 0 or step == self.total_steps)

    def should_save(self, step: int) -> bool:
        """Checkpoint within the epoch after ``step`` (epoch ends are checkpointed by
        :meth:`epoch_ends`)."""
        periodic = self.save_every is not None and step % self.save_every == 0
        return step > 0 and (periodic or step in self.save_at_steps)

    def epoch_ends(self, step: int) -> bool:
        """``step`` closes an epoch (or training): the loop evaluates if asked and always
        checkpoints."""
        return step > 0 and (step % self.steps_per_epoch == 0 or self.done(step))

    def should_evaluate(self, step: int) -> bool:
        """Evaluate the dev split after ``step``: at each epoch end, when the run asks for it."""
        return self.evaluate_dev and self.epoch_ends(step)
