"""``rankwise bench``'s settings, one typed object per mode, built from the flags in
``cli/bench.py``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rankwise.measure.throughput import MIN_WINDOW_S


@dataclass(frozen=True)
class Output:
    """What a bench writes and prints, in both modes."""

    out: Path | None = None
    """The report directory; ``None``: ``runs/bench-<preset or script>-<time>``."""
    explain: str | None = None
    """A row whose step-time breakdown and cause are printed after the table."""
    as_json: bool = False
    """Print the report's summary as JSON, the last stdout line."""


@dataclass(frozen=True)
class SuiteSettings:
    """``rankwise bench``: the built-in app under every strategy."""

    rows: tuple[str, ...] | None = None
    """The rows named (``--strategies``); ``None``: the preset's."""
    preset: str = "quick"
    """``quick`` or ``full`` (:data:`rankwise.tools.bench.suite.PRESETS`)."""
    nproc: int = 2
    """Processes of each multi-process row."""
    data: str | None = None
    """``sentiment`` or a CSV/TSV/JSONL path; ``None``: the preset's."""
    model: str | None = None
    """A model preset or a local path; ``None``: the preset's."""
    repeats: int | None = None
    """Runs of every row; ``None``: the preset's."""
    overrides: tuple[str, ...] = ()
    """``rankwise train`` config overrides (``KEY=VALUE``) for every row."""
    progress: bool = True
    """Show a progress bar."""
    output: Output = Output()
    """Where the report goes, and what else is printed."""


@dataclass(frozen=True)
class ScriptSettings:
    """``rankwise bench --script``: the user's own script, unchanged, as every row."""

    script: Path
    """The training script."""
    script_args: tuple[str, ...] = ()
    """The script's own arguments (after ``--``)."""
    framework: str = "auto"
    """How the script trains (:data:`rankwise.tools.watch.frameworks.FRAMEWORKS`); ``auto``: from
    its imports."""
    strategies: tuple[str, ...] | None = None
    """rankwise strategies (a script on ``rankwise.setup()``) or the launcher's own (Fabric,
    Accelerate); ``None``: not given (a script on ``rankwise.setup()`` gets the default rows)."""
    nproc: tuple[int, ...] = (2,)
    """Processes: one count for a script on ``rankwise.setup()``; else a row per count."""
    steps: int = 20
    """Optimizer steps of each timed run."""
    verify_steps: int = 5
    """Steps of each row's equivalence check (``rankwise verify``, dropout off)."""
    min_window_s: float = MIN_WINDOW_S
    """The least a row's timed window lasts (0: the steps as asked, once)."""
    precision: str | None = None
    """The precision of every row; ``None``: the script's."""
    repeats: int | None = None
    """Runs of every row; ``None``: one."""
    output: Output = Output()
    """Where the report goes, and what else is printed."""
