"""rankwise bench: every strategy on the same job, timed fairly, with correctness in the same
report.

  rankwise bench                               quick preset, every available row, 2 processes
  rankwise bench --preset full --strategies ddp,fsdp,deepspeed-zero3,accelerate
  rankwise bench --data my.csv --model small --out runs/bench-mine
  rankwise bench --script my_train.py --strategies ddp,fsdp -- --my-arg 1
                                               your own script, unchanged

Rows: single, dp, ddp (torchrun-style), ddp-spawn, ddp+bf16, ddp+fp16-hook, fsdp,
deepspeed-zero1/2/3, accelerate, horovod — each a real `rankwise train` — and loops that do
not use rankwise: plain-ddp (hand-written), plain-accelerate, per-step-sync (barrier and
loss .item() every step).  The quick preset (`make demo`) runs one row per strategy and
launcher and leaves out ddp+fp16-hook, deepspeed-zero1, deepspeed-zero3, plain-accelerate
and per-step-sync unless named.  Only when named: ddp+bf16-hook, ddp+powersgd and single-1t
(one thread; adds DDP's scaling efficiency).  A row whose library is missing says so, with
the install command.

Method: data prepared once; one seed everywhere, the app's stock settings (dropout on);
`single`/`dp` get all C cores as threads, N ranks C/N each; throughput after the warm-up
steps, checkpoints and evaluations left out; repeats alternate the order and the report
takes medians.  Equivalence, by the criterion the table names for each row: `lockstep`
is `rankwise verify` of the built-in app under the row's strategy (as --script rows have):
K steps with dropout off, one process following the ranks step by step; rows verify cannot
run or judge (the loops without rankwise, horovod under horovodrun, DDP's compression hooks,
one-process variants of single) compare their weights after K steps with `single`'s, in
separate untimed runs with dropout 0, against the row's stated tolerance (`weights`).

Writes report.md, report.json (every number) and report.png to --out, and prints the table.
Exit 0 when every row ran and passed, 1 when a row failed a check (equivalence, evaluation
count), 4 when a row or its equivalence check could not run (its error once, under the table,
with the script's line).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rankwise.cli import paths, smoke
from rankwise.errors import ConfigError
from rankwise.measure.throughput import MIN_WINDOW_S
from rankwise.tools.bench import suite, user_script, why
from rankwise.tools.bench.rows import all_rows
from rankwise.tools.bench.settings import Output, ScriptSettings, SuiteSettings
from rankwise.tools.bench.suite import PRESETS
from rankwise.tools.watch.frameworks import FRAMEWORKS


def add_parser(commands) -> None:
    p = commands.add_parser(
        "bench",
        help="benchmark every strategy on one job, with correctness checks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rows = all_rows()
    p.add_argument(
        "--preset",
        choices=list(PRESETS),
        default="quick",
        help="; ".join(
            f"{name}: " + ", ".join(f"{k}={v}" for k, v in values.items())
            for name, values in PRESETS.items()
        )
        + f" (smoke runs {', '.join(row.name for row in rows if row.smoke)} unless --strategies "
        "names others; default quick)",
    )
    p.add_argument(
        "--strategies",
        metavar="ROW,ROW",
        help="rows to run (single is always added as the reference): "
        f"{', '.join(row.name for row in rows if not row.opt_in)}; the quick preset leaves out "
        f"{', '.join(row.name for row in rows if row.full_only)} unless named; only when named: "
        f"{', '.join(row.name for row in rows if row.opt_in)}. With --script: rankwise strategies "
        "for a script on rankwise.setup(); the launcher's own strategy names for a Lightning "
        "Fabric script (fabric run --strategy: ddp, fsdp, deepspeed, ...) or an Accelerate one "
        "(ddp, fsdp, deepspeed), each a row at the largest --nproc-per-node",
    )
    p.add_argument(
        "--nproc",
        "--nproc-per-node",
        type=_world_sizes,
        default=[2],
        metavar="N[,N...]",
        help="processes of each multi-process row (default 2); --script on a script not on "
        "rankwise.setup(): a row per world size, e.g. 1,2 (one process is always the first row)",
    )
    p.add_argument("--data", help="sentiment (default) | PATH.csv/.tsv/.jsonl")
    p.add_argument("--model", help="tiny (default) | small | base | LOCAL_PATH")
    p.add_argument("--repeats", type=int, help="runs of every row (default: the preset's)")
    p.add_argument("--out", help="report directory (default runs/bench-<preset>-<time>)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a `rankwise train` config override for every row (e.g. max_steps=100)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--json", action="store_true", help="print report.json's summary as the last stdout line"
    )
    p.add_argument(
        "--script",
        metavar="SCRIPT.py",
        help="benchmark your own script, unchanged, instead of `rankwise train`; arguments after "
        "-- go to it. On rankwise.setup(): --strategies are strategy names (default "
        "ddp,fsdp,deepspeed-zero2,accelerate; single is the reference). Plain torch, Accelerate, "
        "Trainer or Fabric: a row per world size (--nproc-per-node 1,2), started as its "
        "framework's launcher would",
    )
    p.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        default="auto",
        help="--script: how the script trains (default: from its imports)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=20,
        help="--script: optimizer steps of each timed run (default 20)",
    )
    p.add_argument(
        "--min-window",
        type=float,
        default=MIN_WINDOW_S,
        metavar="SECONDS",
        help="--script: the least a row's timed window lasts; a fast script runs on, a short one "
        f"runs again and its windows are pooled, until it has (default {MIN_WINDOW_S:g}; 0: the "
        "--steps as asked, once)",
    )
    p.add_argument(
        "--verify-steps",
        type=int,
        default=5,
        help="--script: steps of each row's equivalence check, `rankwise verify` with dropout off "
        "(default 5)",
    )
    p.add_argument(
        "--precision", help="--script: the precision every row runs at (default: the script's)"
    )
    p.add_argument(
        "--explain",
        metavar="ROW",
        help="after the table, ROW's step-time breakdown: every rank's compute, exposed "
        "communication, data wait, host syncs and wait for the slowest rank, and the cause; with "
        "--report, from an earlier bench's report.json, without running anything",
    )
    p.add_argument(
        "--report",
        metavar="REPORT.json",
        help="--explain: the report of an earlier `rankwise bench`",
    )
    p.add_argument("script_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def _world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a process count or a list, such as 2 or 1,2,4"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: process counts are at least 1")
    return sizes


def run(args: argparse.Namespace) -> int:
    if args.report:
        if not args.explain:
            raise ConfigError("--report: give --explain ROW (the row of that report to explain)")
        print(why.explain_report(paths.absolute(args.report), args.explain))
        return 0
    # every path against the user's directory: rows and checks run elsewhere (cli/paths.py)
    name = Path(args.script).stem if args.script else args.preset
    default_out = f"runs/bench-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    output = Output(
        out=paths.absolute(args.out or default_out), explain=args.explain, as_json=args.json
    )
    strategies = (
        tuple(name.strip() for name in args.strategies.split(",") if name.strip())
        if args.strategies is not None
        else None
    )
    if smoke.on():
        _smoke_size(args)
    if args.script:
        script_args = args.script_args[1:] if args.script_args[:1] == ["--"] else args.script_args
        return user_script.bench(
            ScriptSettings(
                script=paths.absolute(args.script),
                script_args=paths.script_arguments(script_args),
                framework=args.framework,
                strategies=strategies,
                nproc=tuple(args.nproc),
                steps=args.steps,
                verify_steps=args.verify_steps,
                min_window_s=args.min_window,
                precision=args.precision,
                repeats=args.repeats,
                output=output,
            )
        )
    if len(args.nproc) > 1:
        raise ConfigError(
            "--nproc: one process count (several are for --script on a script not on "
            "rankwise.setup())"
        )
    if args.script_args:
        raise ConfigError(
            f"unexpected arguments {' '.join(args.script_args)} (only --script takes arguments "
            "after --)"
        )
    return suite.bench(
        SuiteSettings(
            rows=strategies if args.strategies else None,
            preset=args.preset,
            nproc=args.nproc[0],
            data=paths.config_value("data.source", args.data),
            model=paths.config_value("model.name", args.model),
            repeats=args.repeats,
            overrides=tuple(paths.overrides(args.set)),
            progress=not args.no_progress,
            output=output,
        )
    )


def _smoke_size(args: argparse.Namespace) -> None:
    """RANKWISE_SMOKE=1 (cli/smoke.py): the rows as asked, each checked, at a smoke size."""
    args.repeats = 1
    if args.script:
        args.steps = smoke.cap(args.steps, smoke.SCRIPT_STEPS)
        args.verify_steps = smoke.cap(args.verify_steps, smoke.VERIFY_STEPS)
        args.min_window = 0.0
        smoke.say(
            "bench",
            f"{args.steps} timed steps a row, no least window, one repeat, "
            f"{args.verify_steps}-step equivalence checks",
        )
    else:
        args.preset = "smoke"
        smoke.say("bench", "the smoke preset, one repeat")
