"""A watched script on N ranks, as its framework's launcher would start it, measured like every tool
run."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

from rankwise.process import threads_per_process
from rankwise.tools.harness import run_measured
from rankwise.tools.watch import spawned, stall, window, workdir
from rankwise.tools.watch.findings import load_records
from rankwise.tools.watch.frameworks import Framework
from rankwise.tools.watch.settings import WatchSettings


def _output_tree(origin: Path, run_dir: Path) -> tuple[Path, ...]:
    """The entry of the user's directory that holds this run's directory (``runs/``): rankwise's
    output, not the script's input, left out of the mirror."""
    run_dir = run_dir.resolve()
    if origin in run_dir.parents:
        return (origin / run_dir.relative_to(origin).parts[0],)
    return (run_dir,) if run_dir == origin else ()


def watched_run(
    script: Path,
    script_args: list[str],
    framework: Framework,
    processes: int,
    settings: WatchSettings,
    *,
    timeout_s: float = 900.0,
) -> dict:
    """``rankwise launch --nproc-per-node PROCESSES`` (with the framework's launch flags: a script
    on ``rankwise.setup()``, its strategy's) of the watcher's bootstrap around ``script``, watched
    as ``settings`` say (built once by the tool, handed to every process whole), in
    ``settings.directory/scratch`` (the script's own outputs land there): ``probe.json`` with
    ``wall_s``, or ``{"error": ...}`` (``ended_early`` when the script finished before
    ``settings.watched_steps`` optimizer steps).

    An ``mp.spawn`` script starts its own ranks: the bootstrap runs it as one ``python script.py``,
    its ``nprocs`` as it passes them (PROCESSES 1: one process, the reference), and ``spawn`` says
    what it passed (:func:`rankwise.tools.watch.spawned.read_records`)."""
    run_dir = settings.directory
    scratch = run_dir / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    # (the script's relative paths read the user's files; its writes stay in the scratch)
    origin = Path.cwd().resolve()
    workdir.mirror(origin, scratch, leave_out=_output_tree(origin, run_dir))
    # (an earlier run in the same directory)
    for stale in run_dir.glob(window.RANK_PEAKS.format(rank="*")):
        stale.unlink()
    if framework.name == "spawn":
        settings = replace(settings, spawn=spawned.ONE if processes == 1 else "as written")
    env = {
        **framework.environment_for(processes),
        **settings.to_environment(),
        workdir.ORIGIN: str(origin),
    }
    bootstrap = ["-m", "rankwise.tools.watch.bootstrap", str(script.resolve()), *script_args]
    # (Horovod's ranks: its launcher's, over gloo here)
    if framework.name == "horovod" and processes > 1:
        command = [
            str(Path(sys.executable).with_name("horovodrun")),
            "-np",
            str(processes),
            "-H",
            f"localhost:{processes}",
            "--gloo",
            sys.executable,
            *bootstrap,
        ]
        env.setdefault(
            "OMP_NUM_THREADS",
            os.environ.get("OMP_NUM_THREADS") or str(threads_per_process(processes)),
        )
    elif framework.name == "spawn":
        # (what `rankwise launch` would set for its workers; the script's children inherit it)
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS") or str(
            threads_per_process(processes)
        )
        command = [sys.executable, *bootstrap]
    elif framework.name == "horovod":  # one process: Horovod runs alone, as `python script.py`
        command = [sys.executable, *bootstrap]
    else:
        command = [
            sys.executable,
            "-m",
            "rankwise.cli",
            "launch",
            "--nproc-per-node",
            str(processes),
            *framework.launch_flags,
            *bootstrap,
        ]
    result = run_measured(
        command,
        run_dir,
        env=env,
        timeout_s=timeout_s,
        cwd=scratch,
        result_file=run_dir / "probe.json",
    )
    if "error" not in result:
        # (a script that left its group before the window's end)
        result = window.read_rank_peaks(run_dir, result)
    started = spawned.read_records(run_dir) if framework.name == "spawn" else None
    if (
        framework.name == "spawn"
        and started is None
        and ("error" not in result or result.get("no_result"))
    ):
        return {
            "error": "the script never called mp.spawn (nor "
            "torch.multiprocessing.start_processes): it started no ranks (pass --framework torch "
            "if torchrun should start it)",
            "wall_s": result["wall_s"],
        }
    if started is not None:
        result["spawn"] = started
    if result.get("no_result"):
        records = load_records(run_dir)
        trained = records[0]["steps"] if records else None
        ran = f" after {trained} optimizer step{'s' * (trained != 1)}" if records else ""
        advice = (
            "pass fewer steps, or script arguments that train longer"
            if trained is None or trained >= 2
            else f"verify it with --steps {trained}; a timed run needs 2, a warm-up and a measured "
            "one: script arguments that train longer"
        )
        return {
            "error": f"the script ended{ran}, before the {settings.watched_steps} asked ({advice})",
            "wall_s": result["wall_s"],
            "ended_early": True,
            **({"spawn": started} if started else {}),
        }
    if "error" in result:
        stalled = stall.describe(stall.read_dumps(run_dir), script)
        if stalled:  # where each rank waited says more than the launcher's "exit code 1"
            result["error"] = f"{stalled}\n(the launcher: {result['error']})"
    return result
