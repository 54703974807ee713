"""``rankwise bench --script``: a user's own script, unchanged, under each strategy, against one
process.

A script as its user wrote it (plain torch, Accelerate, Trainer, Fabric) has a row per world size
instead (``--nproc-per-node 1,2``): each starts as its framework's launcher would, with the watcher
(:mod:`rankwise.tools.watch`) measuring the steps, and the equivalence column is ``rankwise
verify``'s watched judgement (:func:`rankwise.tools.verify.command.verify_watched`).  The strategy
is the script's own: a framework that could switch it through its launch settings does so only on
GPUs (Accelerate on a machine without one runs DDP only), which the table says.

A script on ``rankwise.setup()``: each row runs ``rankwise launch --strategy NAME SCRIPT ARGS`` in
fresh processes, in a scratch directory (the script's own outputs land there), under the same
watcher, which also follows the script's Runtime (:mod:`rankwise.tools.watch.runtime`): the script
stops after ``--steps`` optimizer steps, having reported its steady throughput and every rank's peak
memory.  Those runs measure the script as written, dropout and all.  The equivalence column is
``rankwise verify``'s judgement of the row (:mod:`rankwise.tools.verify.command`): the row's
strategy traced for ``--verify-steps`` steps with dropout modules switched off, one process
following it in lockstep, and the first finding of its diagnosis when it is not equivalent.  Random
operations rankwise cannot switch off make a row "not comparable": neither pass nor FAIL.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankwise.errors import ConfigError
from rankwise.launch.choice import Choice
from rankwise.logs import get_logger
from rankwise.measure.breakdown import PROFILED_STEPS
from rankwise.measure.flops import mfu
from rankwise.measure.throughput import MIN_WINDOW_S
from rankwise.strategies import lookup, unavailable
from rankwise.tools.bench import disturbed, script_report, why
from rankwise.tools.bench.equivalence import lockstep_columns as _equivalence
from rankwise.tools.bench.records import RunResult
from rankwise.tools.bench.report import EXIT_COULD_NOT_RUN, median, run_line
from rankwise.tools.bench.settings import ScriptSettings
from rankwise.tools.verify.command import EXIT, verify_runs, verify_watched
from rankwise.tools.verify.records import VerifyReport
from rankwise.tools.watch.frameworks import Framework, detect, framework, rankwise_framework
from rankwise.tools.watch.runs import watched_run
from rankwise.tools.watch.settings import WatchSettings

log = get_logger(__name__)

DEFAULT_STRATEGIES = ("ddp", "fsdp", "deepspeed-zero2", "accelerate")


@dataclass(frozen=True)
class ScriptRow:
    strategy: str
    processes: int
    framework: Framework | None = None
    """A script not on rankwise.setup(): its framework, which chooses the strategy (``strategy``
    says which)."""

    @property
    def name(self) -> str:
        return (
            self.strategy if self.framework is None else f"{self.framework.label} x{self.processes}"
        )

    @property
    def reference(self) -> bool:
        return self.strategy == "single" if self.framework is None else self.processes == 1

    def missing(self) -> str | None:
        """Why this row cannot run here: a strategy's package not installed, a framework strategy
        this machine rules out."""
        if self.framework is not None:
            return self.framework.unavailable
        reason = unavailable(self.strategy)
        return f"not installed: {reason}" if reason else None


def watched_rows(
    framework: Framework, world_sizes: list[int], strategies: Sequence[str] = ()
) -> list[ScriptRow]:
    """One row per world size, one process first (the reference); with ``strategies`` (the
    framework's launcher's own names), the reference and one row per strategy at the largest world
    size."""
    if not strategies:
        sizes = sorted(set([1, *world_sizes]))
        return [ScriptRow(framework.strategy_at(n), n, framework) for n in sizes]
    processes = max(world_sizes)
    if processes < 2:
        raise ConfigError(
            "--strategies: the strategies' rows need several processes (--nproc-per-node 2)"
        )
    chosen = [framework.with_strategy(name) for name in dict.fromkeys(strategies)]
    return [
        ScriptRow(framework.strategy_at(1), 1, framework),
        *(ScriptRow(choice.strategy_at(processes), processes, choice) for choice in chosen),
    ]


def rows_for(strategies: list[str], nproc: int) -> list[ScriptRow]:
    """``single`` first (the reference), then each named strategy at ``nproc`` processes
    (one-process ones at 1)."""
    names = ["single", *[name for name in strategies if name != "single"]]
    rows = []
    for name in names:
        try:
            processes = nproc if lookup(name).cls.multiprocess else 1
            # each row runs under `rankwise launch --strategy NAME`
            Choice(name).check_launch(processes)
        except (ValueError, ConfigError) as e:
            raise ConfigError(f"--strategies: {e}") from None
        rows.append(ScriptRow(name, processes))
    return rows


def run_bench(
    script: Path,
    script_args: list[str],
    rows: list[ScriptRow],
    *,
    steps: int,
    repeats: int,
    precision: str | None,
    out: Path,
    timeout_s: float = 900.0,
    verify_steps: int = 5,
    min_window_s: float = MIN_WINDOW_S,
) -> dict:
    """Every row ``repeats`` times (alternating the order), then each distributed row's equivalence
    (``rankwise verify`` for ``verify_steps`` steps); the summary with one line per row.
    ``min_window_s``: the least a row's timed window lasts (a fast script runs on, a short one
    again, until it has)."""
    script = script.resolve()
    runs: dict[str, list[dict]] = {row.name: [] for row in rows}
    runnable = [row for row in rows if row.missing() is None]
    total, done = len(runnable) * repeats, 0
    warmup = max(1, steps // 4)
    for repeat in range(repeats):
        for row in runnable if repeat % 2 == 0 else runnable[::-1]:
            run_dir = out / "runs" / f"{row.name.replace(' ', '-')}-{repeat}"
            measured: list[RunResult] = []
            # A script shorter than the window runs again, and its steady windows are pooled (the
            # script's epochs repeated, each run's warm-up left out).
            while not measured or _runs_again(measured, min_window_s):
                part = (
                    run_dir
                    if not measured
                    else run_dir.with_name(f"{run_dir.name}-again{len(measured)}")
                )
                started_as = row.framework or rankwise_framework(row.strategy, precision)
                settings = WatchSettings(
                    part,
                    watched_steps=steps,
                    warmup=warmup,
                    trace=False,
                    keep_dropout=True,
                    min_window_s=min_window_s,
                    profile_steps=PROFILED_STEPS,
                )
                measured.append(
                    watched_run(
                        script,
                        script_args,
                        started_as,
                        row.processes,
                        settings,
                        timeout_s=timeout_s,
                    )
                )
            result = _pooled(measured)
            runs[row.name].append({**result, "run_dir": str(run_dir)})
            done += 1
            # as suite.py
            print(
                f"bench [{done}/{total}] {run_line(row.name, repeat, repeats, result)}",
                file=sys.stderr,
                flush=True,
            )
    verdicts = {}
    for row in runnable:
        if row.reference or not any("error" not in run for run in runs[row.name]):
            continue
        where = out / "verify" / row.name.replace(" ", "-")
        if row.framework is None:
            verdicts[row.name] = verify_runs(
                script,
                script_args,
                row.strategy,
                row.processes,
                where,
                steps=verify_steps,
                precision=precision,
                timeout_s=timeout_s,
            )
        else:
            verdicts[row.name] = verify_watched(
                script,
                script_args,
                row.framework,
                row.processes,
                where,
                steps=verify_steps,
                timeout_s=timeout_s,
            )
        # (the table's verdict, which is verify's exit code's: one verdict wherever it is said)
        log.info(
            f"equivalence of {row.name} (rankwise verify, {verify_steps} steps, dropout off): "
            f"{_equivalence(verdicts[row.name])['verdict']}",
            stderr=True,
        )
    return summarize(rows, runs, verdicts, min_window_s)


MAX_POOLED_RUNS = 5
"""At most this many runs of a short script make one measurement."""


def _runs_again(measured: list[dict], min_window_s: float = MIN_WINDOW_S) -> bool:
    """Whether a script that ended before its window lasted ``MIN_WINDOW_S`` should run once
    more."""
    last = measured[-1]
    return bool(
        "error" not in last
        and last.get("script_ended")
        and len(measured) < MAX_POOLED_RUNS
        and sum(run.get("steady_s") or 0 for run in measured) < min_window_s
    )


def _pooled(measured: list[dict]) -> dict:
    """One measurement from the steady windows of several runs of a short script: their samples over
    their seconds."""
    if len(measured) == 1 or any("error" in run for run in measured):
        return next((run for run in measured if "error" in run), measured[0])
    seconds = sum(run["steady_s"] for run in measured)
    samples = sum((run.get("steady_samples_per_s") or 0) * run["steady_s"] for run in measured)
    return {
        **measured[0],
        "steady_s": round(seconds, 4),
        "steady_samples_per_s": round(samples / seconds, 2) if samples and seconds else None,
        "timed_steps": sum(run.get("timed_steps") or 0 for run in measured),
        "wall_s": round(sum(run["wall_s"] for run in measured), 2),
        "pooled_runs": len(measured),
        "peak_rss_mb": [
            max(values) for values in zip(*(run["peak_rss_mb"] for run in measured), strict=True)
        ],
    }


def summarize(
    rows: list[ScriptRow],
    runs: dict[str, list[dict]],
    verdicts: dict[str, VerifyReport],
    min_window_s: float = MIN_WINDOW_S,
) -> dict:
    ok = {name: [run for run in row_runs if "error" not in run] for name, row_runs in runs.items()}
    base_speed = median(
        ok.get(next((row.name for row in rows if row.reference), "single"), []),
        "steady_samples_per_s",
    )
    lines: list[dict[str, Any]] = []
    for row in rows:
        line: dict[str, Any] = {
            "row": row.name,
            "processes": row.processes,
            "strategy": row.strategy,
        }
        missing = row.missing()
        if missing:
            lines.append(
                {**line, "status": missing}
                if row.framework is None
                else {**line, "status": "not available here", "reason": missing}
            )
            continue
        good = ok[row.name]
        if not good:  # the error once, in the notes under the table
            lines.append({**line, "status": "could not run", "reason": runs[row.name][0]["error"]})
            continue
        first = good[0]
        speed = median(good, "steady_samples_per_s")
        line |= {
            "status": "ok",
            "precision": first.get("precision"),
            "samples_per_s": speed,
            "speedup": round(speed / base_speed, 3) if speed and base_speed else None,
            "peak_rss_mb": first["peak_rss_mb"],
            "cuda_max_allocated_mb": first.get("cuda_max_allocated_mb"),
            "wall_s": median(good, "wall_s"),
            "equivalent": None,
            "verdict": None,
            "reason": None,
            **_window(good, min_window_s),
            **_utilisation(first, speed),
        }
        line |= why.summary(first.get("breakdown"))
        if row.reference:
            line["verdict"] = "reference"
        elif row.name in verdicts:
            line |= _equivalence(verdicts[row.name])
        hung = next((run["hung_at_exit"][0] for run in good if run.get("hung_at_exit")), None)
        if hung:  # its window was whole; the rank was ended after it, by the exit guard
            line["reason"] = "; ".join(filter(None, [line.get("reason"), f"a run's {hung}"]))
        if first.get("samples_counted_by") is None:
            line["samples_per_s"], line["speedup"] = None, None
            line["reason"] = "; ".join(
                filter(
                    None,
                    [
                        line.get("reason"),
                        "samples/s unknown: no training batch came from a DataLoader",
                    ],
                )
            )
        lines.append(line)
    disturbed.mark(lines, ok, next((row.name for row in rows if row.reference), None))
    passing = [
        line
        for line in lines
        if line.get("verdict") in ("equivalent", "reference") and line["samples_per_s"]
    ]
    fastest = max(passing, key=lambda line: line["samples_per_s"], default=None)
    # A disturbed row's figure says nothing either way: no other row is "fastest" in its place.
    undecided = [line["row"] for line in passing if line.get("disturbed")]
    return {
        "rows": lines,
        "runs": runs,
        "verify": {name: _equivalence(report)["verdict"] for name, report in verdicts.items()},
        "fastest": fastest["row"] if fastest and not undecided else None,
        "fastest_undecided": undecided,
        "min_window_s": min_window_s,
    }


def _utilisation(run: dict, samples_per_s: float | None) -> dict:
    """The row's TFLOP/s (its FLOPs per sample, counted by the watcher, times its samples/s) and MFU
    against the peak its ranks measured (and the datasheet's, for a known GPU); ``None`` where the
    FLOPs were not counted."""
    per_sample = run.get("flops_per_sample")
    if not per_sample or not samples_per_s:
        return {
            "tflops_per_s": None,
            "mfu": None,
            "mfu_datasheet": None,
            "flops_counted": run.get("flops_counted"),
        }
    achieved = per_sample * samples_per_s
    peak, sheet = run.get("peak_flops_per_s"), run.get("datasheet_flops_per_s")
    return {
        "tflops_per_s": float(f"{achieved / 1e12:.4g}"),
        # (None where the step outran the "peak": it was no peak, see measure.flops.mfu)
        "mfu": float(f"{share:.4g}") if (share := mfu(achieved, peak)) is not None else None,
        "mfu_datasheet": float(f"{achieved / sheet:.4g}") if sheet else None,
        "flops_counted": run["flops_counted"],
    }


def _window(good: list[dict], min_window_s: float) -> dict:
    """How the row's throughput was timed: the window per run (median), its steps, and the spread
    over repeats ((fastest - slowest) / median, ``None`` with one run)."""
    speeds = [run["steady_samples_per_s"] for run in good if run.get("steady_samples_per_s")]
    middle = median(good, "steady_samples_per_s")
    return {
        "window_s": median(good, "steady_s", 3),
        "timed_steps": median(good, "timed_steps", 0),
        "script_ended": any(run.get("script_ended") for run in good),
        "pooled_runs": max(run.get("pooled_runs", 1) for run in good),
        "window_short": any((run.get("steady_s") or 0) < min_window_s for run in good),
        "spread": round((max(speeds) - min(speeds)) / middle, 4)
        if len(speeds) > 1 and middle
        else None,
    }


def bench(config: ScriptSettings) -> int:
    """``rankwise bench --script``: run, write report.md/json/png, print the table."""
    from rankwise.tools.machine import machine

    if max(config.nproc) < 2:
        raise ConfigError("--nproc must be at least 2: the multi-process rows need several ranks")
    if config.repeats is not None and config.repeats < 1:
        raise ConfigError("--repeats must be at least 1")
    script = config.script
    if not script.is_file():
        raise ConfigError(f"--script {script}: no such file")
    if config.steps < 2:
        raise ConfigError("--steps must be at least 2 (a warm-up step and a measured one)")
    if config.verify_steps < 1:
        raise ConfigError("--verify-steps must be at least 1")
    if config.min_window_s < 0:
        raise ConfigError("--min-window must be 0 or more seconds")
    name = detect(script) if config.framework == "auto" else config.framework
    notes = []
    nproc = list(config.nproc)
    if name == "rankwise":
        if len(nproc) > 1:
            raise ConfigError(
                "--nproc: one process count for a script on rankwise.setup() (its rows are "
                "strategies)"
            )
        given = config.strategies
        rows = rows_for(list(DEFAULT_STRATEGIES if given is None else given), nproc[0])
    else:
        if config.precision:
            raise ConfigError(
                f"--precision: {script} is a {name} script, which sets its own precision"
            )
        strategies = list(config.strategies or ())
        if strategies and name not in ("fabric", "accelerate"):
            raise ConfigError(
                f"--strategies: {script} is a {name} script, which sets its own strategy in its "
                "code; its rows are world sizes (--nproc-per-node 1,2)"
            )
        watched = framework(name)
        rows = watched_rows(watched, nproc, strategies)
        notes = [f"{name} script, started {watched.launch}; each row runs it unchanged"]
        if watched.note:
            notes.append(watched.note)
    output = config.output
    why.check_row(output.explain, [row.name for row in rows])
    out = (
        output.out or Path(f"runs/bench-{script.stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    ).absolute()
    script_args = list(config.script_args)
    log.info(
        f"rankwise bench --script {script}: {len(rows)} rows x {config.repeats or 1} repeat(s), "
        f"{config.steps} steps, {','.join(map(str, nproc))} processes; writing to {out}",
        stderr=True,
    )
    summary = run_bench(
        script,
        script_args,
        rows,
        steps=config.steps,
        repeats=config.repeats or 1,
        precision=config.precision,
        out=out,
        verify_steps=config.verify_steps,
        min_window_s=config.min_window_s,
    )
    summary["notes"] = notes
    meta = {
        "script": str(script),
        "script_args": script_args,
        "steps": config.steps,
        "nproc": nproc,
        "framework": name,
        **machine(),
    }
    paths = script_report.write(summary, meta, out)
    # The command's output (the table, the files, the JSON): printed whatever the logging level.
    print(script_report.table(summary))
    print(f"\nwrote {paths['md']}, {paths['json']}, {paths['png']}")
    if output.explain:
        print(f"\n{why.explained(summary['rows'], output.explain)}")
    if output.as_json:
        print(json.dumps({"rows": summary["rows"]}, default=str))
    return exit_code(summary["rows"])


SEVERITY = (1, EXIT_COULD_NOT_RUN, EXIT["vacuous"], EXIT["not comparable"])
"""Exit codes, gravest first: a row that fails its check, one that could not run, one whose
compared steps trained nothing, one whose random draws no rank count reproduces."""


def exit_code(rows: list[dict]) -> int:
    """The gravest of the rows' verdicts, each as ``rankwise verify`` exits for it (so bench and
    verify exit alike on the same script); a row that would pass without a figure fails: it is
    never a pass unseen (a row that is not comparable stays what verify says of it)."""
    failed = [
        line["row"]
        for line in rows
        if line.get("verdict") in ("not equivalent", "unchecked")
        or (
            line["status"] == "ok"
            and line["samples_per_s"] is None
            and line.get("verdict") == "equivalent"
        )
    ]
    crashed_rows = [
        line["row"] for line in rows if "could not run" in (line["status"], line.get("verdict"))
    ]
    if failed:
        log.error(
            f"rankwise bench: {', '.join(failed)} failed the equivalence check (see the table)"
        )
    if crashed_rows:
        log.error(f"rankwise bench: {', '.join(crashed_rows)} could not run (why: under the table)")
    codes = {EXIT[line["verdict"]] for line in rows if line.get("verdict") in EXIT}
    codes |= {1} if failed else set()
    codes |= {EXIT_COULD_NOT_RUN} if crashed_rows else set()
    return next((code for code in SEVERITY if code in codes), 0)
