"""``rankwise verify``: the script on N ranks, then on one process in lockstep with it, traced;
where they part, and why.

Every script runs under the same probe, the watcher (:mod:`rankwise.tools.watch`): a script as its
user wrote it (plain torch, Accelerate, Trainer, Fabric) started as its framework would start it
(:mod:`rankwise.tools.verify.watched`), a script on ``rankwise.setup()`` as ``rankwise launch
--strategy`` starts it, its reference under ``--strategy single``
(:mod:`rankwise.tools.watch.runtime`).  Both runs have the same seed and global batches, dropout
modules switched off (unless ``--keep-dropout``), and stop after ``--steps`` optimizer steps.  The
N-rank run goes first and records, every step, the gradient its optimizer received and the weights
after it; the one-process run then starts each step from those weights, compares its own gradient
there and steps with the N-rank gradient (:mod:`rankwise.measure.tolerance` states the criterion).
The report is printed and written as ``verify.md``, ``verify.json`` and ``verify.png``; the per-step
weights and gradients are deleted after the comparison unless ``--keep-weights``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from rankwise.checkpoint import write_text_atomic
from rankwise.errors import ConfigError
from rankwise.launch.choice import Choice
from rankwise.logs import get_logger
from rankwise.measure.tolerance import UPDATE, gradient_tolerance, tolerance
from rankwise.strategies import lookup
from rankwise.tools.harness import crashed
from rankwise.tools.verify.compare import (
    TracedRun,
    compare,
    first_difference,
    nothing_trained,
    random_ops,
    start_differs,
)
from rankwise.tools.verify.diagnose import diagnose
from rankwise.tools.verify.records import ReportExtra, VerifyReport
from rankwise.tools.verify.report import render
from rankwise.tools.verify.sample_diff import unmatched_samples
from rankwise.tools.verify.settings import VerifySettings
from rankwise.tools.verify.step_plot import plot
from rankwise.tools.verify.watched import watched_runs
from rankwise.tools.watch.findings import findings, load_records
from rankwise.tools.watch.frameworks import Framework, detect, framework, rankwise_framework
from rankwise.tools.watch.records import FindingRecord
from rankwise.tools.watch.stall import STALL_TIMEOUT_S

log = get_logger(__name__)

EXIT = {"equivalent": 0, "not equivalent": 1, "not comparable": 3, "could not run": 4, "vacuous": 5}
"""``rankwise verify``'s exit code for each verdict."""
INCOMPARABLE = ("random", "own-batches")
"""Causes that make the steps not comparable when they are the only ones: each rank draws its own
numbers, or makes its own batch, so no rank count reproduces one process."""


def check(config: VerifySettings) -> tuple[Path, int, Framework | None]:
    """Refuse what cannot run, before anything starts: the script, the strategy at this rank count,
    the options. Returns the script, the distributed run's process count and, for a script not on
    rankwise.setup(), its framework."""
    script = config.script
    if not script.is_file():
        raise ConfigError(f"{script}: no such script")
    if config.steps < 1:
        raise ConfigError("--steps must be at least 1")
    name = detect(script) if config.framework == "auto" else config.framework
    if name != "rankwise":
        if config.strategy or config.precision or config.overrides:
            raise ConfigError(
                f"{script} is a {name} script: it chooses its own strategy and precision, and "
                "verify runs it as written; --strategy, --precision and --set are for scripts on "
                "rankwise.setup()"
            )
        if config.nproc_per_node < 2:
            raise ConfigError(
                "--nproc-per-node must be at least 2: one process is the reference already"
            )
        return script, config.nproc_per_node, framework(name)
    if config.reference_args is not None:
        raise ConfigError(
            "--reference-args is for scripts not on rankwise.setup() (whose global batch rankwise "
            "keeps the same at every world size by itself)"
        )
    if not config.strategy:
        raise ConfigError(
            f"--strategy: {script} is on rankwise.setup(); name the strategy to check (ddp, fsdp, "
            "...)"
        )
    try:
        variant = lookup(config.strategy)
    except ValueError as e:
        raise ConfigError(f"--strategy: {e}") from None
    processes = config.nproc_per_node if variant.cls.multiprocess else 1
    if variant.cls.multiprocess and processes < 2:
        raise ConfigError(
            "--nproc-per-node must be at least 2: one process is the reference already"
        )
    Choice.from_flags(
        config.strategy, config.precision, list(config.overrides), processes
    ).check_launch(processes)
    return script, processes, None


def verify_runs(
    script: Path,
    script_args: list[str],
    strategy: str,
    processes: int,
    out: Path,
    *,
    steps: int,
    precision: str | None = None,
    settings: tuple[str, ...] = (),
    keep_dropout: bool = False,
    timeout_s: float = 600.0,
    keep_weights: bool = False,
    as_written: bool = False,
    log: Callable[[str], None] | None = None,
    stall_s: float = STALL_TIMEOUT_S,
    compared_only: bool = False,
) -> VerifyReport:
    """The two traced runs (the N-rank one first, then one process following it) and their report,
    written under ``out`` as ``verify.json`` and ``verify.png``; ``log(text)`` hears of each run as
    it ends.  ``compared_only``: the N-rank run stops after the compared steps too (``rankwise
    bench``'s check of a row whose evaluation, checkpoint and shutdown its timed run shows)."""
    results, extra = watched_runs(
        script,
        script_args,
        rankwise_framework(strategy, precision, settings),
        processes,
        out,
        steps=steps,
        keep_dropout=keep_dropout,
        timeout_s=timeout_s,
        reference_framework=rankwise_framework("single", precision),
        as_written=as_written,
        log=log,
        stall_s=stall_s,
        compared_only=compared_only,
    )
    report = _merged(build(out, results, strategy, processes, steps), extra)
    report["meta"] = {
        "script": str(script),
        "script_args": script_args,
        "steps": steps,
        "precision": precision,
        "set": list(settings),
        "keep_dropout": keep_dropout,
    }
    return _written(out, report, keep_weights)


def verify_watched(
    script: Path,
    script_args: list[str],
    framework: Framework,
    processes: int,
    out: Path,
    *,
    steps: int,
    keep_dropout: bool = False,
    timeout_s: float = 600.0,
    keep_weights: bool = False,
    reference_args: list[str] | None = None,
    as_written: bool = False,
    log: Callable[[str], None] | None = None,
    stall_s: float = STALL_TIMEOUT_S,
) -> VerifyReport:
    """A script as its user wrote it: the two watched runs, compared like :func:`verify_runs`'s,
    with the findings that need no reference."""
    results, extra = watched_runs(
        script,
        script_args,
        framework,
        processes,
        out,
        steps=steps,
        keep_dropout=keep_dropout,
        timeout_s=timeout_s,
        reference_args=reference_args,
        as_written=as_written,
        log=log,
        stall_s=stall_s,
    )
    # (a script that starts its own ranks: as many as it started)
    processes = extra.pop("processes", processes)
    report = _merged(
        build(out, results, f"{framework.name} script", processes, steps, framework=framework.name),
        extra,
    )
    report["meta"] = {
        "script": str(script),
        "script_args": script_args,
        "steps": steps,
        "keep_dropout": keep_dropout,
        "reference_args": reference_args,
    }
    return _written(out, report, keep_weights)


def _merged(report: VerifyReport, extra: ReportExtra) -> VerifyReport:
    """The comparison's report with the distributed run's own findings, the comparison's first (a
    failure, then errors first)."""
    # (a finding the diagnosis ranked among the causes is said there, once)
    named = {cause["text"] for cause in report.get("causes", [])}
    found = [
        finding
        for finding in [*report.pop("comparison_findings"), *extra.pop("findings", [])]
        if finding["text"] not in named
    ]
    order = {"failed": 0, "error": 1}  # (then warnings)
    return (
        report
        | extra
        | {"findings": sorted(found, key=lambda finding: order.get(finding["level"], 2))}
    )


def _written(out: Path, report: VerifyReport, keep_weights: bool) -> VerifyReport:
    write_text_atomic(out / "verify.json", json.dumps(report, indent=2, default=str))
    if report["step_lines"]:
        plot(report, out / "verify.png")
    if not keep_weights:
        for pattern in ("*/step-*.safetensors", "*/grad-*.safetensors"):
            for path in out.glob(pattern):
                path.unlink()
    return report


def exit_code(report: VerifyReport) -> int:
    """The verdict's exit code; 1 as well when the run itself shows a finding that changes results,
    4 when the rest of the script could not be checked (the distributed run failed after the
    compared steps)."""
    # (what a crashed run recorded is partial: its findings decide nothing)
    if report["verdict"] == "could not run":
        return EXIT["could not run"]
    levels = {finding["level"] for finding in report.get("findings", [])}
    if "error" in levels:
        return 1
    if "failed" in levels and report["verdict"] in ("equivalent", "vacuous"):
        return EXIT["could not run"]
    return EXIT[report["verdict"]]


def outcome(report: VerifyReport) -> str:
    """The verdict its exit code states: the report's, unless the run's own findings changed it
    (an error: ``not equivalent``; the rest of the script unchecked: ``could not run``).  What
    ``rankwise bench`` prints for the row, so the two commands agree on one script."""
    return {code: verdict for verdict, code in EXIT.items()}[exit_code(report)]


def run(config: VerifySettings) -> int:
    """``rankwise verify``: check, run both traced runs, write and print the report; returns the
    exit code."""
    script, processes, watched = check(config)
    # (check: one of them)
    label = (config.strategy or f"{watched.name}-script") if watched else config.strategy
    out = (
        config.out or Path(f"runs/verify-{script.stem}-{label}-{time.strftime('%Y%m%d-%H%M%S')}")
    ).absolute()
    script_args = list(config.script_args)
    progress = lambda text: log.info(f"verify: {text}", stderr=True)  # noqa: E731
    if watched is None:
        assert config.strategy is not None  # (check: a script on rankwise.setup() names one)
        log.info(
            f"rankwise verify {script}: {config.strategy} on {processes} process(es), then one "
            f"process in lockstep with it, {config.steps} steps; writing to {out}",
            stderr=True,
        )
        report = verify_runs(
            script,
            script_args,
            config.strategy,
            processes,
            out,
            steps=config.steps,
            precision=config.precision,
            settings=config.overrides,
            keep_dropout=config.keep_dropout,
            timeout_s=config.timeout_s,
            keep_weights=config.keep_weights,
            as_written=config.as_written,
            log=progress,
            stall_s=config.stall_s,
        )
    else:
        log.info(
            f"rankwise verify {script}: a {watched.name} script"
            + (
                " (detected from the script; --framework NAME starts it as another launcher would)"
                if config.framework == "auto"
                else ""
            )
            + f", started {watched.launch}, on "
            f"{processes} processes, then on one process in lockstep with them, {config.steps} "
            f"steps; writing to {out}",
            stderr=True,
        )
        reference_args = list(config.reference_args) if config.reference_args is not None else None
        report = verify_watched(
            script,
            script_args,
            watched,
            processes,
            out,
            steps=config.steps,
            keep_dropout=config.keep_dropout,
            timeout_s=config.timeout_s,
            keep_weights=config.keep_weights,
            reference_args=reference_args,
            as_written=config.as_written,
            log=progress,
            stall_s=config.stall_s,
        )
    report["exit_code"] = exit_code(report)
    report["outcome"] = outcome(report)
    text = render(report)
    report["verdict_line"] = text.splitlines()[-1]
    # (verify.json with the verdict the exit code states, for a program reading it)
    write_text_atomic(out / "verify.json", json.dumps(report, indent=2, default=str))
    write_text_atomic(
        out / "verify.md",
        f"# rankwise verify {script} ({label})\n\n```\n{text}\n```\n\n![differences by "
        "step](verify.png)\n",
    )
    # The command's output (the report, the JSON): printed whatever the logging level.
    print(text)
    if config.as_json:
        print(
            json.dumps(
                {
                    key: report.get(key)
                    for key in (
                        "verdict",
                        "exit_code",
                        "verdict_line",
                        "equivalent",
                        "first_difference",
                        "diagnosis",
                        "findings",
                    )
                },
                default=str,
            )
        )
    return exit_code(report)


_RUN_NAMES = {"candidate": "distributed", "reference": "one-process"}


def build(
    out: Path,
    results: dict,
    strategy: str,
    processes: int,
    steps_asked: int,
    framework: str | None = None,
) -> VerifyReport:
    """Compare the two traced runs: every step, the first that differs, the diagnosis and the
    verdict."""
    reference, candidate = TracedRun.load(out / "reference"), TracedRun.load(out / "candidate")
    ranks = load_records(out / "candidate")  # (every rank's record of the N-rank run)
    # The tolerance of what the distributed run really ran: the script's own precision and options
    # count too.
    facts = candidate.facts or reference.facts
    precision, comm_hook = facts.get("precision", "32-true"), facts.get("comm_hook", "none")
    limit, gradient_limit = (
        tolerance(precision),
        gradient_tolerance(precision, bool(facts.get("tf32"))),
    )
    failure = {name: result["error"] for name, result in results.items() if crashed(result)}
    noted: list[FindingRecord] = []
    if "candidate" in failure and "reference" not in failure and candidate.reached >= steps_asked:
        # The N-rank run failed after the compared window: the comparison stands, the failure is a
        # finding.
        shortened = any(
            p.get("cut_after") is not None for record in ranks for p in record["passes"]
        )
        # (not an error of the script's as such: the shortening, a timeout or a stall may have
        # caused it)
        noted.append(
            {
                "level": "failed",
                "kind": "failed-after",
                "text": f"after the {steps_asked} compared steps the distributed run failed, so "
                f"the rest of the script was not checked: {failure.pop('candidate')}"
                + (
                    ". Its training passes were cut short after the compared steps: a script that "
                    "cannot take a short pass (next() on an exhausted iterator) runs whole with "
                    "--as-written"
                    if shortened
                    else ""
                ),
            }
        )
    for name, result in results.items():
        # (the run's work is whole: the comparison stands)
        for line in result.get("hung_at_exit", ()):
            noted.append(
                {
                    "level": "warning",
                    "kind": "hung-at-exit",
                    "text": f"in the {_RUN_NAMES.get(name, name)} run, {line} (rankwise launch "
                    "ends such a rank after --exit-grace seconds and exits 3)",
                }
            )
    lines = compare(reference, candidate, limit, gradient_limit) if not failure else []
    first = first_difference(lines)
    start = start_differs(lines)
    if start:
        noted.append({"level": "warning", "kind": "start-differs", "text": start})
    # Only where no step differs: a difference is its own verdict, whatever else trained.
    vacuous = nothing_trained(candidate, lines) if lines and first is None else None
    samples = unmatched_samples(ranks, load_records(out / "reference"))
    # A crashed N-rank run is still explained against the one process where it can be (a parameter
    # without gradient).
    causes = (
        []
        if "reference" in failure
        else diagnose(
            reference,
            candidate,
            lines,
            first,
            strategy=strategy,
            world_size=processes,
            failure=failure.get("candidate"),
            steps_asked=steps_asked,
            framework=framework,
            samples=samples,
            run_findings=[finding.as_dict() for finding in findings(ranks, processes)],
        )
    )
    diagnosis = [cause["text"] for cause in causes]
    random = random_ops(reference)
    draws = sum(rank["random_draws"] for ranks in reference.records.values() for rank in ranks[:1])
    if (
        samples
        and any(line["data"] in ("differs", "unmatched") for line in lines)
        and not any(samples in finding for finding in diagnosis)
    ):
        noted.append(
            {
                "level": "error",
                "kind": "samples",
                "text": f"the runs' samples do not match: {samples}",
            }
        )
    if failure:
        # a run crashed: nothing was compared, so nothing is claimed either way
        verdict = "could not run"
    elif vacuous:
        # nothing trained: agreement of zeros proves nothing, a difference in them little
        verdict = "vacuous"
    elif first is None and not diagnosis and len(lines) > 1:
        verdict = "equivalent"
    elif (
        causes
        and all(cause["kind"] in INCOMPARABLE for cause in causes)
        and (draws or any(cause["kind"] == "own-batches" for cause in causes))
    ):
        # each rank draws its own numbers, or its own batch: no rank count reproduces one process
        verdict = "not comparable"
    else:
        # (random draws too, then: a finding of its own explains a difference)
        verdict = "not equivalent"
    return {
        "strategy": strategy,
        "processes": processes,
        "tolerance": limit,
        "gradient_tolerance": gradient_limit,
        "update_tolerance": UPDATE,
        "precision": facts.get("precision"),
        "comm_hook": comm_hook,
        "step_lines": lines,
        "steps_asked": steps_asked,
        "steps_reached": [reference.reached, candidate.reached],
        "first_difference": first,
        "diagnosis": diagnosis,
        "causes": causes,
        "failure": failure,
        "random_ops": random,
        "dropout": {
            "modules": reference.facts.get("dropout", []),
            "known": bool(reference.facts),
            "kept": bool(reference.facts.get("dropout_kept")),
        },
        "verdict": verdict,
        "equivalent": verdict == "equivalent",
        "vacuous": vacuous,
        "comparison_findings": noted,
    }
