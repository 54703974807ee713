"""``rankwise verify``: the script on one process, then on N ranks, traced; where they part, and why.

Both runs are ``rankwise launch --strategy`` of the unchanged script with the Runtime's probe and
trace on (:mod:`rankwise.trace`): the same seed and global batches, dropout modules switched off
(unless ``--keep-dropout``), stopped after ``--steps`` optimizer steps.  The report is printed
and written as ``verify.md`` and ``verify.json``; the per-step weights are deleted after the
comparison unless ``--keep-weights``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from rankwise.checkpoint import write_text_atomic
from rankwise.errors import ConfigError
from rankwise.launch.choice import Choice
from rankwise.probe import DIRECTORY, STEPS, WARMUP
from rankwise.strategies import lookup
from rankwise.tolerance import tolerance
from rankwise.tools.harness import run_script
from rankwise.tools.verify.compare import TracedRun, compare, first_difference
from rankwise.tools.verify.diagnose import diagnose
from rankwise.tools.verify.report import render
from rankwise.trace import DROPOUT, TRACE


def check(args) -> tuple[Path, int]:
    """Refuse what cannot run, before anything starts: the script, the strategy at this rank count, the options."""
    script = Path(args.script)
    if not script.is_file():
        raise ConfigError(f"{script}: no such script")
    if args.steps < 1:
        raise ConfigError("--steps must be at least 1")
    try:
        variant = lookup(args.strategy)
    except ValueError as e:
        raise ConfigError(f"--strategy: {e}") from None
    processes = args.nproc_per_node if variant.cls.multiprocess else 1
    if variant.cls.multiprocess and processes < 2:
        raise ConfigError("--nproc-per-node must be at least 2: one process is the reference already")
    Choice.from_flags(args.strategy, args.precision, args.set, processes)
    return script, processes


def run(args) -> int:
    script, processes = check(args)
    out = Path(args.out or f"runs/verify-{script.stem}-{args.strategy}-{time.strftime('%Y%m%d-%H%M%S')}")
    print(f"rankwise verify {script}: {args.strategy} on {processes} process(es) against one process, {args.steps} "
          f"steps; writing to {out}", file=sys.stderr, flush=True)
    results = {}
    for name, strategy, count, settings in (("reference", "single", 1, ()),
                                            ("candidate", args.strategy, processes, tuple(args.set))):
        run_dir = out / name
        shutil.rmtree(run_dir, ignore_errors=True)  # a trace appends: start it empty
        env = {DIRECTORY: str(run_dir.resolve()), STEPS: str(args.steps), WARMUP: "1", TRACE: "1",
               DROPOUT: "keep" if args.keep_dropout else "off"}
        results[name] = run_script(script, args.script_args, strategy, count, run_dir, probe_env=env,
                                   precision=args.precision, settings=settings, timeout_s=args.timeout)
        outcome = results[name].get("error", "ok")
        print(f"verify: {strategy} on {count} process(es): {results[name]['wall_s']} s, {outcome}", file=sys.stderr,
              flush=True)
    report = build(out, results, args.strategy, processes, args.steps)
    report["meta"] = {"script": str(script), "script_args": args.script_args, "steps": args.steps,
                      "precision": args.precision, "set": args.set, "keep_dropout": args.keep_dropout}
    text = render(report)
    write_text_atomic(out / "verify.md", f"# rankwise verify {script} --strategy {args.strategy}\n\n```\n{text}\n```\n")
    write_text_atomic(out / "verify.json", json.dumps(report, indent=2, default=str))
    if not args.keep_weights:
        for weights in out.glob("*/step-*.safetensors"):
            weights.unlink()
    print(text)
    if args.json:
        print(json.dumps({key: report[key] for key in ("equivalent", "first_difference", "diagnosis")}, default=str))
    return 0 if report["equivalent"] else 1


def build(out: Path, results: dict, strategy: str, processes: int, steps_asked: int) -> dict:
    """Compare the two traced runs: every step, the first that differs, the diagnosis and the verdict."""
    reference, candidate = TracedRun.load(out / "reference"), TracedRun.load(out / "candidate")
    # The tolerance of what the distributed run really ran: the script's own precision and options count too.
    facts = candidate.facts or reference.facts
    limit = tolerance(facts.get("precision", "32-true"), facts.get("comm_hook", "none"))
    failure = {name: result["error"] for name, result in results.items()
               if "error" in result and not result.get("ended_early")}
    lines = compare(reference, candidate, limit) if "reference" not in failure else []
    first = first_difference(lines)
    diagnosis = [] if "reference" in failure else diagnose(
        reference, candidate, lines, first, strategy=strategy, world_size=processes, failure=failure.get("candidate"),
        steps_asked=steps_asked)
    return {"strategy": strategy, "processes": processes, "tolerance": limit, "precision": facts.get("precision"),
            "steps": lines, "steps_asked": steps_asked, "steps_reached": [reference.reached, candidate.reached],
            "first_difference": first, "diagnosis": diagnosis, "failure": failure,
            "dropout": {"modules": reference.facts.get("dropout", []), "known": bool(reference.facts),
                        "kept": bool(reference.facts.get("dropout_kept"))},
            "equivalent": not failure and first is None and not diagnosis and len(lines) > 1}
