"""A watched script on N ranks, as its framework's launcher would start it, measured like every tool run."""

from __future__ import annotations

import sys
from pathlib import Path

from rankwise.throughput import MIN_WINDOW_S
from rankwise.tools.harness import run_measured
from rankwise.tools.watch import stall
from rankwise.tools.watch.bootstrap import DIRECTORY, DROPOUT, FOLLOW, MIN_WINDOW, SCALE, STALL, STEPS, TRACE, WARMUP
from rankwise.tools.watch.findings import load_records
from rankwise.tools.watch.frameworks import Framework


def watched_run(script: Path, script_args: list[str], framework: Framework, processes: int, run_dir: Path, *,
                steps: int, warmup: int = 1, trace: bool = True, follow: Path | None = None, scale: int = 1,
                keep_dropout: bool = False, timeout_s: float = 900.0, min_window_s: float = MIN_WINDOW_S,
                stall_s: float = 0.0) -> dict:
    """``rankwise launch --nproc-per-node PROCESSES`` (with the framework's launch flags: a script on
    ``rankwise.setup()``, its strategy's) of the watcher's bootstrap around ``script``, in
    ``RUN_DIR/scratch`` (the script's own outputs land there): ``probe.json`` with ``wall_s``, or
    ``{"error": ...}`` (``ended_early`` when the script finished before ``steps`` optimizer steps).  ``stall_s``:
    a rank that makes no progress for that long is stopped, and the error says where each rank waited (0: never)."""
    scratch = run_dir / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**framework.environment_for(processes), DIRECTORY: str(run_dir.resolve()), STEPS: str(steps),
           WARMUP: str(warmup), TRACE: "1" if trace else "0", DROPOUT: "keep" if keep_dropout else "off",
           SCALE: str(scale), FOLLOW: str(follow.resolve()) if follow else "", MIN_WINDOW: str(min_window_s),
           STALL: str(stall_s)}
    command = [sys.executable, "-m", "rankwise.cli", "launch", "--nproc-per-node", str(processes),
               *framework.launch_flags, "-m", "rankwise.tools.watch.bootstrap", str(script.resolve()), *script_args]
    result = run_measured(command, run_dir, env=env, timeout_s=timeout_s, cwd=scratch,
                          result_file=run_dir / "probe.json")
    if result.get("no_result"):
        records = load_records(run_dir)
        ran = f" after {records[0]['steps']} optimizer steps" if records else ""
        return {"error": f"the script ended{ran}, before the {steps} asked (pass fewer steps, or script arguments "
                         "that train longer)", "wall_s": result["wall_s"], "ended_early": True}
    if "error" in result:
        stalled = stall.describe(stall.read_dumps(run_dir), script)
        if stalled:  # where each rank waited says more than the launcher's "exit code 1"
            result["error"] = f"{stalled}\n(the launcher: {result['error']})"
    return result
