"""The watcher's settings: built once by the tool that starts a watched run
(:mod:`rankwise.tools.watch.runs`), handed to each of its processes whole as one serialised value,
``RANKWISE_WATCH`` (registered in :mod:`rankwise.envvars`), and read back there: one set of
defaults, the dataclass's."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from rankwise.measure.throughput import MIN_WINDOW_S

VARIABLE = "RANKWISE_WATCH"
"""The variable the settings cross to a watched process in (JSON)."""

AFTER_WINDOW = ("stop", "shorten", "as-written")
"""What a watched run does after its last traced step (see :mod:`rankwise.tools.watch.watcher`)."""


@dataclass(frozen=True)
class WatchSettings:
    """How one watched process watches its script."""

    directory: Path
    """Where the watcher writes its trace, its rank's record and its measurements."""
    watched_steps: int
    """Optimizer steps watched: traced (``verify``) or timed (``bench --script``); the tools take
    them as ``--steps``."""
    warmup: int = 1
    """Steps left out of a benchmark's timed window: at least 1 and less than ``watched_steps``
    (where ``watched_steps`` allows)."""
    follow: Path | None = None
    """The N-rank run's directory that a one-process reference follows in lockstep (``None``: the
    run goes alone)."""
    scale: int = 1
    """The factor the one-process reference scales each training loader's batch by: the world size
    it stands in for."""
    keep_dropout: bool = False
    """Leave dropout on; otherwise it is switched off at a model's first forward."""
    trace: bool = True
    """Record every step for ``verify``'s comparison; otherwise a benchmark: the timed window
    only."""
    min_window_s: float = MIN_WINDOW_S
    """The least seconds a benchmark's timed window lasts."""
    after: str = "stop"
    """After the last traced step: one of :data:`AFTER_WINDOW`."""
    profile_steps: int = 0
    """Steps a benchmark profiles after its warm-up for its step-time breakdown (0: none)."""
    stall_s: float = 0.0
    """Seconds a watched process may make no progress before it is stopped with its stack (0:
    never)."""
    spawn: str = ""
    """Non-empty for an ``mp.spawn`` script: the bootstrap is the process that starts its ranks;
    ``"one"``: the one-process reference (:mod:`rankwise.tools.watch.spawned`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory))
        if self.follow is not None:
            object.__setattr__(self, "follow", Path(self.follow))
        object.__setattr__(self, "warmup", max(1, min(self.warmup, self.watched_steps - 1)))
        if self.after not in AFTER_WINDOW:
            raise ValueError(f"after={self.after!r}: one of {', '.join(AFTER_WINDOW)}")

    def to_environment(self) -> dict[str, str]:
        """The variable that hands these settings to a watched process, whole."""
        fields = asdict(self)
        fields["directory"] = str(self.directory.resolve())
        fields["follow"] = str(self.follow.resolve()) if self.follow else None
        return {VARIABLE: json.dumps(fields)}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> WatchSettings:
        """The settings the tool handed this process (``RANKWISE_WATCH`` must be set)."""
        return cls(**json.loads(environ[VARIABLE]))
