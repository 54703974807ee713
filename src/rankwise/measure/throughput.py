"""Training throughput without the warm-up and the pauses: what a benchmark compares.

The first steps of a run pay for memory allocation, caches and lazy initialisation; a
checkpoint or an evaluation between steps is not training.  ``SteadyThroughput`` counts
samples and tokens only over the steps after ``warmup_steps``, and only the time from the
end of one step (or of a pause) to the end of the next.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable


def count_tokens(batch: dict) -> int:
    """Real (unpadded) tokens in a text batch; 0 for inputs without an attention mask."""
    mask = batch.get("attention_mask") if isinstance(batch, dict) else None
    return int(mask.sum()) if mask is not None else 0


class SteadyThroughput:
    def __init__(self, warmup_steps: int, timed: int | None = None):
        """Count the steps after the first ``warmup_steps``, up to step ``timed`` of this run
        (``None``: every later one; the steps after it are profiled, not timed)."""
        self.warmup_steps = warmup_steps
        self.timed = timed
        self.steps_seen = 0
        self.steps = 0
        self.seconds = 0.0
        self.warmup_seconds = 0.0
        """The warm-up steps' own time (a compiled model's compile included), apart from the
        rates."""
        self.samples = 0
        self.tokens = 0
        self.shapes: Counter = Counter()
        """The counted steps' micro-batches as ``(rows, padded length)``: what their FLOPs are
        counted from."""
        self._since = time.perf_counter()

    def restart(self) -> None:
        """Time from now: call after anything that is not a training step (evaluation,
        checkpoint)."""
        self._since = time.perf_counter()

    def step(
        self, samples: int, tokens: int, shapes: Iterable[tuple[int, int | None]] = ()
    ) -> None:
        """One optimizer step ended, over ``samples`` samples and ``tokens`` tokens (this process's
        count), in micro-batches of ``shapes``."""
        now = time.perf_counter()
        self.steps_seen += 1
        if self.steps_seen <= self.warmup_steps:
            self.warmup_seconds += now - self._since
        elif self.timed is None or self.steps_seen <= self.timed:
            self.steps += 1
            self.seconds += now - self._since
            self.samples += samples
            self.tokens += tokens
            self.shapes.update(shapes)
        self._since = now

    def rates(self, all_tokens: int | None = None) -> dict:
        """``steady_samples_per_s`` and ``tokens_per_s`` (``all_tokens``: every rank's count
        summed), None when no step came after the warm-up."""
        tokens = self.tokens if all_tokens is None else all_tokens
        warmup: dict[str, float] = {
            "warmup_steps": min(self.steps_seen, self.warmup_steps),
            "warmup_s": round(self.warmup_seconds, 3),
        }
        if not self.steps or self.seconds <= 0:
            return {
                **warmup,
                "steady_steps": 0,
                "steady_samples_per_s": None,
                "tokens_per_s": None,
            }
        return {
            **warmup,
            "steady_steps": self.steps,
            "steady_samples_per_s": round(self.samples / self.seconds, 2),
            "tokens_per_s": round(tokens / self.seconds, 1) if tokens else None,
        }


MIN_WINDOW_S = 2.0
"""A benchmark's timed window lasts at least this long where the script trains long enough: a 10 ms
window of a fast script reads throughputs 20 % apart from one run to the next."""
MAX_WINDOW_STEPS = 5000
"""...and takes at most this many timed steps to get there."""


def window_end(step: int, warmup: int, elapsed_s: float, min_window_s: float = MIN_WINDOW_S) -> int:
    """The optimizer step a benchmark's timing ends at, decided at ``step`` (after ``step - warmup``
    timed steps that took ``elapsed_s``): ``step`` when the window lasted ``min_window_s`` already,
    else the step at which it will have at the pace measured so far (at most ``MAX_WINDOW_STEPS``
    timed steps)."""
    timed = step - warmup
    if timed < 1 or elapsed_s >= min_window_s or timed >= MAX_WINDOW_STEPS:
        return step
    per_step = max(elapsed_s / timed, 1e-6)
    return warmup + max(timed + 1, min(MAX_WINDOW_STEPS, int(1.05 * min_window_s / per_step) + 1))
