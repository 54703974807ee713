"""rankwise bench: every strategy on the same job, timed fairly, with correctness in the same report.

  rankwise bench                                   quick preset, every available row, 2 processes
  rankwise bench --preset full --strategies ddp,fsdp,deepspeed-zero3,accelerate
  rankwise bench --data my.csv --model small --out runs/bench-mine

Rows: single, dp, ddp (torchrun-style), ddp-spawn, ddp+bf16, ddp+fp16-hook, fsdp,
deepspeed-zero1/2/3, accelerate, horovod — each a real `rankwise train` — and loops that do
not use rankwise: plain-ddp (hand-written), plain-accelerate, per-step-sync (barrier and
loss .item() every step).  Only when named: ddp+bf16-hook, ddp+powersgd and single-1t (one
thread; adds DDP's scaling efficiency).  A row whose library is missing says so, with the
install command.

Method: data prepared once; dropout 0 and one seed everywhere, so every row should compute
what `single` computes; `single`/`dp` get all C cores as threads, N ranks C/N each;
throughput after the warm-up steps, checkpoints and evaluations left out; the weights
after the first K steps are compared with `single`'s against the row's stated tolerance;
repeats alternate the order and the report takes medians.

Writes report.md, report.json (every number) and report.png to --out, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rankwise.bench import report
from rankwise.bench.rows import ROWS, select
from rankwise.bench.suite import PRESETS, plan, run_all
from rankwise.errors import ConfigError


def add_parser(commands) -> None:
    p = commands.add_parser("bench", help="benchmark every strategy on one job, with correctness checks",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=list(PRESETS), default="quick",
                   help="quick: " + ", ".join(f"{k}={v}" for k, v in PRESETS["quick"].items()) +
                        "; full: " + ", ".join(f"{k}={v}" for k, v in PRESETS["full"].items()))
    p.add_argument("--strategies", metavar="ROW,ROW", help="rows to run (single is always added as the "
                   f"reference): {', '.join(row.name for row in ROWS if not row.opt_in)}; only when named: "
                   f"{', '.join(row.name for row in ROWS if row.opt_in)}")
    p.add_argument("--nproc", type=int, default=2, help="processes of each multi-process row (default 2)")
    p.add_argument("--data", help="sentiment (default) | PATH.csv/.tsv/.jsonl")
    p.add_argument("--model", help="tiny (default) | small | base | LOCAL_PATH")
    p.add_argument("--repeats", type=int, help="runs of every row (default: the preset's)")
    p.add_argument("--out", help="report directory (default runs/bench-<preset>-<time>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a `rankwise train` config override for every row (e.g. max_steps=100)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print report.json's summary as the last stdout line")


def run(args: argparse.Namespace) -> int:
    from rankwise.bench.common import machine
    from rankwise.doctor import versions

    if args.nproc < 2:
        raise ConfigError("--nproc must be at least 2: the multi-process rows need several ranks")
    if args.repeats is not None and args.repeats < 1:
        raise ConfigError("--repeats must be at least 1")
    try:
        rows = select([n.strip() for n in args.strategies.split(",") if n.strip()] if args.strategies else None)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    out = Path(args.out or f"runs/bench-{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
    the_plan = plan(args.preset, rows, nproc=args.nproc, out=out, data=args.data, model=args.model,
                    extra=args.set, repeats=args.repeats)
    cfg = the_plan.config  # a bad --set / --data / --model fails here, before anything runs
    print(f"rankwise bench ({args.preset}): {len(rows)} rows x {the_plan.repeats} repeat(s), {cfg.max_steps} steps "
          f"each, {args.nproc} processes on {the_plan.cores} cores; writing to {out}", file=sys.stderr, flush=True)
    records = run_all(the_plan, progress=not args.no_progress)
    libraries = {k: v for k, v in versions().items() if k not in ("python", "torch")}
    meta = {"preset": args.preset, "data": cfg.data.source, "model": cfg.model.name, "steps": cfg.max_steps,
            "batch_size": cfg.batch_size, "nproc": args.nproc, "repeats": the_plan.repeats,
            "equivalence_step": the_plan.equivalence_step, "settings": the_plan.settings, "libraries": libraries,
            **machine()}
    summary = report.summarize(records, meta)
    paths = report.write(summary, out)
    print(report.table(summary))
    print()
    print(report.reading_text(summary))
    print(f"\nwrote {paths['md']}, {paths['json']}, {paths['png']}")
    if args.json:
        print(json.dumps({"rows": summary["rows"], "reading": summary["reading"]}, default=str))
    failed = summary["reading"]["failing"] + [line["row"] for line in summary["rows"]
                                              if line["status"].startswith("failed")]
    if failed:
        print(f"rankwise bench: {', '.join(failed)} failed a run or a check (see the table)", file=sys.stderr)
    return 1 if failed else 0
