"""``rankwise bench``: every strategy on the same job, timed fairly, checked for correctness.

Method:
* The data is prepared once (``data.cache_dir``); every row trains the same model on the
  same seeded batches at the app's stock settings (dropout on).
* Fair cores: ``single`` and ``dp`` get C threads, N ranks C/N each (``OMP_NUM_THREADS``).
* Throughput is the summary's steady rate: the first ``throughput_warmup_steps`` steps,
  checkpoints and evaluations are left out.
* Equivalence, after the timed runs (:mod:`rankwise.tools.bench.equivalence`): ``rankwise verify``'s
  lockstep judgement of the built-in app under the row's strategy for ``K`` steps, as ``--script``
  rows have; rows verify cannot run or judge compare their weights after ``K`` steps with
  ``single``'s, in separate untimed runs with dropout 0, against the row's stated tolerance
  (:mod:`rankwise.measure.tolerance`).
* Repeats alternate the order (forward, then backward, ...) and the report takes medians.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from rankwise.checkpoint import read_weights
from rankwise.errors import ConfigError
from rankwise.logs import get_logger
from rankwise.measure.breakdown import PROFILED_STEPS
from rankwise.measure.tolerance import max_param_diff
from rankwise.process import usable_cores
from rankwise.tools.bench import report, why
from rankwise.tools.bench.equivalence import (
    criterion,
    lockstep_columns,
    verify_app,
    weights_columns,
)
from rankwise.tools.bench.progress import Phase
from rankwise.tools.bench.records import EquivalenceColumns, RowRecord, RunResult
from rankwise.tools.bench.rows import Row, select
from rankwise.tools.bench.settings import SuiteSettings
from rankwise.tools.harness import run_measured, run_train
from rankwise.train.config import TrainConfig, build_config

if TYPE_CHECKING:
    import torch

log = get_logger(__name__)

PRESETS = {
    "smoke": {"max_steps": 30, "repeats": 1},
    "quick": {"max_steps": 40, "repeats": 1},
    "full": {"max_steps": 300, "repeats": 3},
}
"""Steps per run and repeats of every row.  The quick preset is `make demo`'s; smoke (CI's run of
`make demo`) runs four rows (:attr:`~rankwise.tools.bench.rows.Row.smoke`), each checked, in under
3 minutes on 2 cores; full is `make bench`'s."""


@dataclass
class BenchPlan:
    rows: list[Row]
    nproc: int
    repeats: int
    settings: list[str]
    """``--set`` overrides every row shares (data, model, steps, batch, seed, ...): the app's stock
    settings otherwise (dropout on)."""
    out: Path
    equivalence_step: int
    cores: int = field(default_factory=usable_cores)
    timeout_s: float = 900.0

    @cached_property
    def config(self) -> TrainConfig:
        """The configuration every row shares (validated once)."""
        return build_config(overrides=self.settings)

    def threads(self, row: Row) -> int:
        """Fair cores: every row uses all of them, as threads of one process or split among its
        ranks."""
        return row.threads or max(1, self.cores // row.processes(self.nproc))


def plan(
    preset: str,
    rows: list[Row],
    *,
    nproc: int,
    out: Path,
    data: str | None = None,
    model: str | None = None,
    extra: Sequence[str] = (),
    repeats: int | None = None,
) -> BenchPlan:
    values = PRESETS[preset]
    steps = values["max_steps"]
    equivalence_step = 5
    settings = [
        f"max_steps={steps}",
        "batch_size=32",
        "seed=0",
        "eval_split=test",
        f"throughput_warmup_steps={equivalence_step}",
        "log_every=10",
        "dev_each_epoch=false",
        f"profile_steps={PROFILED_STEPS}",
        f"data.cache_dir={json.dumps(str(out / 'data-cache'))}",
    ]
    if data:
        settings.append(f"data.source={json.dumps(data)}")
    if model:
        settings.append(f"model.name={json.dumps(model)}")
    return BenchPlan(
        rows, nproc, repeats or values["repeats"], [*settings, *extra], out, equivalence_step
    )


def run_all(plan: BenchPlan, progress: bool = True) -> list[RowRecord]:
    """Every row ``plan.repeats`` times, alternating the order; one record per row (repeats
    kept)."""
    from rankwise.data.prepare import cache_entry, prepare_data

    cfg = plan.config
    prepared = prepare_data(cfg.data)  # once, into the cache every row reads
    data_dir = cache_entry(cfg.data)
    # every row reads the data prepared once, from the cache (data.cache_dir)
    assert data_dir is not None
    split_size = prepared.size(cfg.eval_split)
    records: dict[str, RowRecord] = {
        row.name: {
            "row": row.name,
            "about": row.about,
            "processes": row.processes(plan.nproc),
            "threads": plan.threads(row),
            "tolerance": row.tolerance,
            "runs": [],
            "missing": row.missing(),
        }
        for row in plan.rows
    }
    runnable = [row for row in plan.rows if records[row.name]["missing"] is None]
    with Phase("bench", len(runnable) * plan.repeats, progress) as phase:
        for repeat in range(plan.repeats):
            order = runnable if repeat % 2 == 0 else runnable[::-1]
            for row in order:
                phase.start(f"{row.name} (repeat {repeat + 1}/{plan.repeats})")
                run_dir = plan.out / "runs" / f"{row.name}-{repeat}"
                run = _run_row(row, plan, run_dir, data_dir, phase)
                records[row.name]["runs"].append(run)
                phase.finished(report.run_line(row.name, repeat, plan.repeats, run))
    checks = check_equivalence(plan, records, runnable, data_dir, progress)
    for row in plan.rows:
        _judge(records[row.name], checks.get(row.name), split_size)
    return [records[row.name] for row in plan.rows]


def _run_row(
    row: Row, plan: BenchPlan, run_dir: Path, data_dir: Path, phase: Phase | None = None
) -> RunResult:
    """One run of ``row`` in fresh processes; its summary (plus ``wall_s`` and ``run_dir``), or
    ``{"error"}``."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    processes = row.processes(plan.nproc)
    env = {"OMP_NUM_THREADS": str(plan.threads(row))}
    metrics, total = run_dir / "metrics.jsonl", plan.config.max_steps

    def progress() -> None:
        if phase is not None:
            step = _last_step(metrics)
            phase.status(f"step {step}/{total}" if step else "starting")

    if row.baseline:
        command = [
            sys.executable,
            "-m",
            "rankwise.tools.bench.baselines",
            row.baseline,
            str(data_dir),
            str(run_dir),
            str(processes),
            plan.config.model_copy(update={"strategy": "ddp"}).model_dump_json(),
        ]
        result = run_measured(
            command,
            run_dir,
            env=env,
            timeout_s=plan.timeout_s,
            on_poll=progress,
            result_file=run_dir / "result.json",
        )
    else:
        assert row.strategy is not None  # a row is a baseline or a rankwise strategy
        procs = ["--nproc-per-node", str(processes)] if processes > 1 else []
        sets = [arg for s in [*plan.settings, *row.settings] for arg in ("--set", s)]
        result = run_train(
            ["--strategy", row.strategy, *procs, *sets],
            run_dir,
            env=env,
            timeout_s=plan.timeout_s,
            on_poll=progress,
        )
    return {**result, "run_dir": str(run_dir)}


def _last_step(metrics: Path) -> int:
    try:
        lines = metrics.read_text(encoding="utf-8").strip().splitlines()
        return int(json.loads(lines[-1]).get("step", 0)) if lines else 0
    except (OSError, ValueError):
        return 0


def _weights_at(run: RunResult, step: int) -> dict[str, torch.Tensor]:
    from rankwise.tools.bench.baselines import weights_file

    run_dir = Path(run["run_dir"])
    baseline = weights_file(run_dir, step)
    return read_weights(
        baseline if baseline.exists() else run_dir / "checkpoints" / f"step-{step:08d}"
    )


def check_equivalence(
    plan: BenchPlan,
    records: dict[str, RowRecord],
    rows: list[Row],
    data_dir: Path,
    progress: bool = True,
) -> dict[str, EquivalenceColumns]:
    """Each row that ran: its equivalence columns by its criterion
    (:func:`~rankwise.tools.bench.equivalence.criterion`), ``criterion`` and ``criterion_note``
    among them.  The progress bar names each check as it runs."""
    ran = {
        row.name: criterion(row, plan.nproc)
        for row in rows
        if any("error" not in run for run in records[row.name]["runs"])
    }
    checks: dict[str, EquivalenceColumns] = {
        name: {"criterion": "reference", "verdict": "reference", "equivalent": True}
        for name, rule in ran.items()
        if rule.kind == "reference"
    }
    lockstep = [row for row in rows if row.name in ran and ran[row.name].kind == "lockstep"]
    weighed = [row for row in rows if row.name in ran and ran[row.name].kind == "weights"]
    # (ddp-spawn trains as ddp does: one verify run for both)
    keys = {(ran[row.name].strategy, row.settings) for row in lockstep}
    steps, verified = plan.equivalence_step, {}
    with Phase("check", len(keys) + (len(weighed) + 1 if weighed else 0), progress) as phase:
        for row in lockstep:
            rule = ran[row.name]
            assert rule.strategy is not None  # a lockstep criterion names the strategy verify runs
            key = (rule.strategy, row.settings)
            what = f"{row.name}: rankwise verify of {rule.strategy}, {steps} steps, dropout off"
            if key not in verified:
                phase.start(what)
                started = time.perf_counter()
                verified[key] = verify_app(
                    rule.strategy,
                    row.processes(plan.nproc),
                    data_dir,
                    [*_unprofiled(plan.settings), *row.settings],
                    plan.out / "verify" / row.name,
                    steps=steps,
                    timeout_s=plan.timeout_s,
                )
                verdict = lockstep_columns(verified[key])["verdict"]
                phase.finished(f"{what}: {verdict} ({time.perf_counter() - started:.1f} s)")
            checks[row.name] = lockstep_columns(verified[key]) | {
                "criterion": "lockstep",
                "criterion_note": rule.note,
            }
        if weighed:
            checks |= _compare_weights(
                plan, weighed, data_dir, {row.name: ran[row.name].note for row in weighed}, phase
            )
    return checks


def _unprofiled(settings: list[str]) -> list[str]:
    """The settings without the breakdown's profiled steps (a check's runs are not timed)."""
    return [setting for setting in settings if not setting.startswith("profile_steps=")]


def _compare_weights(
    plan: BenchPlan,
    rows: list[Row],
    data_dir: Path,
    notes: dict[str, str | None],
    phase: Phase | None = None,
) -> dict[str, EquivalenceColumns]:
    """The rows verify cannot judge, and ``single``, for ``K`` more steps each with dropout 0
    (untimed): each row's columns from its weights after them against ``single``'s."""
    steps = plan.equivalence_step
    short = replace(
        plan,
        settings=[
            *plan.settings,
            "model.dropout=0.0",
            f"max_steps={steps}",
            f"save_at_steps=[{steps}]",
        ],
    )
    where = plan.out / "equivalence"
    runs = {}
    for row in [Row("single", "single"), *rows]:
        what = f"{row.name}: weights after {steps} steps (dropout 0)"
        if phase is not None:
            phase.start(what)
        runs[row.name] = _run_row(row, short, where / row.name, data_dir)
        if phase is not None:
            phase.finished(f"{what}: {runs[row.name]['wall_s']} s")
    reference, problem = None, runs["single"].get("error")
    if problem is None:
        try:
            reference = _weights_at(runs["single"], steps)
        except Exception as e:  # noqa: BLE001 - a missing checkpoint: every comparison says why
            problem = str(e)
    checks: dict[str, EquivalenceColumns] = {}
    for row in rows:
        difference, error = (
            None,
            runs[row.name].get("error") or (problem and f"single's run: {problem}"),
        )
        if error is None and reference is not None:  # (no error: single's weights were read)
            try:
                difference = max_param_diff(_weights_at(runs[row.name], steps), reference)
            except Exception as e:  # noqa: BLE001 - a missing or different checkpoint is a failed check, said why
                error = str(e)
        checks[row.name] = weights_columns(
            difference, row.tolerance, steps, error and error[:300]
        ) | {"criterion": "weights", "criterion_note": notes[row.name]}
    return checks


def _judge(record: RowRecord, equivalence: EquivalenceColumns | None, split_size: int) -> None:
    """Add the checks to ``record``: evaluation count, and its equivalence (``check_equivalence``'s
    columns)."""
    runs = [run for run in record["runs"] if "error" not in run]
    record["eval_expected"] = split_size
    if not runs:
        return
    record["eval_count_ok"] = all(run.get("eval_samples") == split_size for run in runs)
    record["equivalence"] = equivalence or {}


def bench(config: SuiteSettings) -> int:
    """``rankwise bench``: run the plan, write report.md/json/png, print the table and the
    reading."""
    from rankwise.tools.machine import machine, versions

    if config.nproc < 2:
        raise ConfigError("--nproc must be at least 2: the multi-process rows need several ranks")
    if config.repeats is not None and config.repeats < 1:
        raise ConfigError("--repeats must be at least 1")
    try:
        rows = select(list(config.rows) if config.rows else None, config.preset)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    output = config.output
    # absolute: the rows and their checks run in other directories (cli/ resolves it already)
    out = (
        output.out or Path(f"runs/bench-{config.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
    ).absolute()
    why.check_row(output.explain, [row.name for row in rows])
    the_plan = plan(
        config.preset,
        rows,
        nproc=config.nproc,
        out=out,
        data=config.data,
        model=config.model,
        extra=list(config.overrides),
        repeats=config.repeats,
    )
    cfg = the_plan.config  # a bad --set / --data / --model fails here, before anything runs
    log.info(
        f"rankwise bench ({config.preset}): {len(rows)} rows x {the_plan.repeats} repeat(s), "
        f"{cfg.max_steps} steps each, {config.nproc} processes on {the_plan.cores} cores; writing "
        f"to {out}",
        stderr=True,
    )
    records = run_all(the_plan, progress=config.progress)
    libraries = {k: v for k, v in versions().items() if k not in ("python", "torch")}
    meta = {
        "preset": config.preset,
        "data": cfg.data.source,
        "model": cfg.model.name,
        "steps": cfg.max_steps,
        "batch_size": cfg.batch_size,
        "nproc": config.nproc,
        "repeats": the_plan.repeats,
        "equivalence_step": the_plan.equivalence_step,
        "settings": the_plan.settings,
        "libraries": libraries,
        **machine(),
    }
    summary = report.summarize(records, meta)
    paths = report.write(summary, out)
    # The command's output (the table, its reading, the files, the JSON): printed whatever the
    # logging level.
    print(report.table(summary))
    print()
    print(report.reading_text(summary))
    print(f"\nwrote {paths['md']}, {paths['json']}, {paths['png']}")
    if output.explain:
        print(f"\n{why.explained(summary['rows'], output.explain)}")
    if output.as_json:
        print(json.dumps({"rows": summary["rows"], "reading": summary["reading"]}, default=str))
    reading = summary["reading"]
    unchecked = reading["unchecked"]
    if reading["failing"]:
        log.error(f"rankwise bench: {', '.join(reading['failing'])} failed a check (see the table)")
    crashed = [row for row in reading["not_run"] if row not in unchecked]
    if crashed:
        log.error(f"rankwise bench: {', '.join(crashed)} did not run (why: under the table)")
    if unchecked:
        log.error(
            "rankwise bench: the equivalence check of "
            + ", ".join(f"{row} ({verdict})" for row, verdict in unchecked.items())
            + " did not pass or fail (why: under the table)"
        )
    return report.exit_code(reading)
