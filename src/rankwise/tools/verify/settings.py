"""``rankwise verify``'s settings, one typed object built from the flags in ``cli/verify.py``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rankwise.tools.watch.stall import STALL_TIMEOUT_S


@dataclass(frozen=True)
class VerifySettings:
    script: Path
    """The training script, run as written."""
    script_args: tuple[str, ...] = ()
    """The script's own arguments (after ``--``)."""
    strategy: str | None = None
    """For a script on ``rankwise.setup()``: the strategy checked."""
    framework: str = "auto"
    """How the script trains, so it starts as its launcher would; ``auto``: from its imports."""
    reference_args: tuple[str, ...] | None = None
    """The script's arguments for the one-process reference, when its batching cannot be scaled by
    N."""
    nproc_per_node: int = 2
    """Ranks of the distributed run."""
    steps: int = 5
    """Optimizer steps compared with one process; the distributed run then goes on through the
    script."""
    as_written: bool = False
    """After the compared steps, run the rest of the script as written (not cut to two steps a
    pass)."""
    precision: str | None = None
    """The precision of both runs; ``None``: the script's."""
    overrides: tuple[str, ...] = ()
    """Options of the strategy's section for the distributed run (``SECTION.KEY=VALUE``)."""
    keep_dropout: bool = False
    """Leave dropout modules on in both runs."""
    keep_weights: bool = False
    """Keep every step's weights and gradients under ``out``."""
    out: Path | None = None
    """The report directory; ``None``: ``runs/verify-<script>-<strategy>-<time>``."""
    timeout_s: float = 600.0
    """Seconds each run may take."""
    stall_s: float = STALL_TIMEOUT_S
    """Stop a rank that makes no progress for this long (0: never)."""
    as_json: bool = False
    """Print the verdict as JSON, the last stdout line."""
