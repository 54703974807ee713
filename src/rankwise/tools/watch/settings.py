"""The watcher's settings: the ``RANKWISE_WATCH_*`` variables a tool hands each rank
(:mod:`rankwise.tools.watch.runs`), parsed once per process into :class:`WatchSettings` (registered
in :mod:`rankwise.envvars`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rankwise.measure.throughput import MIN_WINDOW_S

DIRECTORY, STEPS, WARMUP = "RANKWISE_WATCH", "RANKWISE_WATCH_STEPS", "RANKWISE_WATCH_WARMUP"
TRACE, DROPOUT = "RANKWISE_WATCH_TRACE", "RANKWISE_WATCH_DROPOUT"
FOLLOW, SCALE = "RANKWISE_WATCH_FOLLOW", "RANKWISE_WATCH_SCALE"
MIN_WINDOW, AFTER = "RANKWISE_WATCH_MIN_WINDOW", "RANKWISE_WATCH_AFTER"
STALL, SPAWN = "RANKWISE_WATCH_STALL", "RANKWISE_WATCH_SPAWN"
PROFILE = "RANKWISE_WATCH_PROFILE"
"""The watcher's settings, as the tools hand them to each rank."""

AFTER_WINDOW = ("stop", "shorten", "as-written")
"""What a watched run does after its last traced step (see :mod:`rankwise.tools.watch.watcher`)."""


@dataclass(frozen=True)
class WatchSettings:
    """How one watched process watches its script."""

    directory: Path
    """Where the watcher writes its trace, its rank's record and its measurements
    (``RANKWISE_WATCH``)."""
    steps: int
    """Optimizer steps watched: traced (``verify``) or timed (``bench --script``)
    (``RANKWISE_WATCH_STEPS``, default 20)."""
    warmup: int = 1
    """Steps left out of a benchmark's timed window (``RANKWISE_WATCH_WARMUP``, default 1; from the
    environment at least 1 and less than ``steps``)."""
    follow: Path | None = None
    """The N-rank run's directory that a one-process reference follows in lockstep
    (``RANKWISE_WATCH_FOLLOW``; ``None``: the run goes alone)."""
    scale: int = 1
    """The factor the one-process reference scales each training loader's batch by: the world size
    it stands in for (``RANKWISE_WATCH_SCALE``)."""
    keep_dropout: bool = False
    """Leave dropout on (``RANKWISE_WATCH_DROPOUT=keep``); otherwise it is switched off at a model's
    first forward."""
    trace: bool = True
    """Record every step for ``verify``'s comparison (``RANKWISE_WATCH_TRACE=1``); otherwise a
    benchmark: the timed window only."""
    min_window_s: float = MIN_WINDOW_S
    """The least seconds a benchmark's timed window lasts (``RANKWISE_WATCH_MIN_WINDOW``)."""
    after: str = "stop"
    """After the last traced step: one of :data:`AFTER_WINDOW` (``RANKWISE_WATCH_AFTER``)."""
    profile_steps: int = 0
    """Steps a benchmark profiles after its warm-up for its step-time breakdown
    (``RANKWISE_WATCH_PROFILE``; 0: none)."""
    stall_s: float = 0.0
    """Seconds a watched process may make no progress before it is stopped with its stack
    (``RANKWISE_WATCH_STALL``; 0: never)."""
    spawn: str = ""
    """Non-empty for an ``mp.spawn`` script (``RANKWISE_WATCH_SPAWN``): the bootstrap is the process
    that starts its ranks; ``"one"``: the one-process reference
    (:mod:`rankwise.tools.watch.spawned`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory))
        if self.follow is not None:
            object.__setattr__(self, "follow", Path(self.follow))
        if self.after not in AFTER_WINDOW:
            raise ValueError(f"after={self.after!r}: one of {', '.join(AFTER_WINDOW)}")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> WatchSettings:
        """The settings the tool handed this process (``RANKWISE_WATCH`` must be set)."""
        steps = int(environ.get(STEPS, "20"))
        return cls(
            Path(environ[DIRECTORY]),
            steps=steps,
            warmup=max(1, min(int(environ.get(WARMUP, "1")), steps - 1)),
            follow=Path(environ[FOLLOW]) if environ.get(FOLLOW) else None,
            scale=int(environ.get(SCALE, "1")),
            keep_dropout=environ.get(DROPOUT) == "keep",
            trace=environ.get(TRACE) == "1",
            min_window_s=float(environ.get(MIN_WINDOW, MIN_WINDOW_S)),
            after=environ.get(AFTER, "stop"),
            profile_steps=int(environ.get(PROFILE) or 0),
            stall_s=float(environ.get(STALL) or 0),
            spawn=environ.get(SPAWN, ""),
        )
