"""Peak memory per rank of the sharded strategies against DDP, on a large model.

Trains a few steps of a BERT preset (default ``large``, ~310M parameters) with ``ddp``,
``fsdp`` and ``deepspeed`` ZeRO-3, each as ``rankwise train ... --json``, and prints each
rank's peak resident memory during training (model construction included; the final
evaluation and checkpoint excluded) and its ratio to DDP's, then the overall peak with the
checkpoint (full weights are gathered onto rank 0 for it, a bucket at a time)::

    python -m rankwise.tools.bench.memory                          # large, 2 ranks
    python -m rankwise.tools.bench.memory --model base --nproc 4   # ~90M parameters, 4 ranks

What to expect per parameter, fp32 with AdamW: DDP holds weights, gradients and two
Adam moments, 16 bytes on every rank.  FSDP shards all four, 16 / N bytes, plus the
layers gathered at the moment.  ZeRO-3 holds 16 / N as well once rankwise lets it
update the parameter partition in place (DeepSpeed 0.19 alone keeps a separate fp32
master copy, see ``strategies/deepspeed.py``) and steps in sub-groups of
``deepspeed.bucket_size`` elements (its default flattens the whole gradient partition
into a second buffer): measured on ``large`` at 2 ranks, 4,112 MB before, 3,085 after.
Each process also carries a fixed few hundred MB of interpreter and libraries, which
sharding cannot remove.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from rankwise.strategies import get_strategy
from rankwise.tools.harness import run_train
from rankwise.tools.machine import machine

GOAL = 0.6
"""Peak per-rank memory of ZeRO-3 and FSDP, as a fraction of DDP's."""

CASES = ["ddp", "fsdp", "deepspeed-zero3"]
"""Registered strategy names, DDP first: the others are compared with it."""


def run(strategy: str, nproc: int, extra: list[str]) -> dict:
    """``rankwise train --strategy STRATEGY ... --json`` in fresh processes; its summary, or ``{"error"}``."""
    with tempfile.TemporaryDirectory(prefix=f"rankwise-{strategy}-") as out:
        procs = ["--nproc-per-node", str(nproc)] if get_strategy(strategy).multiprocess else []
        return {"strategy": strategy, **run_train(["--strategy", strategy, *procs, *extra], Path(out))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="large", help="BERT preset (default large, ~310M parameters)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--strategies", default=",".join(CASES),
                        help=f"strategies to measure, ddp first as the base (default {','.join(CASES)})")
    args, extra = parser.parse_known_args(argv)
    cases = [name.strip() for name in args.strategies.split(",") if name.strip()]
    if cases[:1] != ["ddp"]:
        parser.error("--strategies must start with ddp: the others are compared with it")
    job = ["--data", "sentiment", "--model", args.model, "--max-steps", str(args.steps), "--precision", args.precision,
           "--batch-size", str(2 * args.nproc), "--set", "data.max_length=32", "--set", "data.limit=64",
           "--set", "model.dropout=0", *extra]
    print(f"{args.model} model, {args.nproc} ranks, {args.precision}, {args.steps} steps\n")
    print("| strategy | parameters | peak RSS per rank in training (MB) | max / DDP | overall peak per rank, "
          "checkpoint included (MB) | samples/s |")
    print("|---|---:|---|---:|---|---:|")
    rows, peaks = {}, {}
    for label in cases:  # ddp first: the others are compared with it as they finish
        row = rows[label] = run(label, args.nproc, job)
        if "error" in row:
            print(f"| {label} | | failed: {row['error']} | | | |", flush=True)
            continue
        peaks[label] = max(train for train, _ in row["peak_rss_mb"])
        ratio = f"{peaks[label] / peaks['ddp']:.2f}" if "ddp" in peaks else "n/a"
        print(f"| {label} | {row['parameters']:,} | {', '.join(f'{t:.0f}' for t, _ in row['peak_rss_mb'])} | "
              f"{ratio} | {', '.join(f'{o:.0f}' for _, o in row['peak_rss_mb'])} | {row['samples_per_s']} |",
              flush=True)
    for label in [label for label in peaks if label != "ddp" and "ddp" in peaks]:
        ratio = peaks[label] / peaks["ddp"]
        print(f"{label}: {ratio:.2f} x DDP ({'meets' if ratio <= GOAL else 'misses'} the <= {GOAL} goal)")
    print(json.dumps({"model": args.model, "nproc": args.nproc, "precision": args.precision, "runs": rows,
                      **machine()}))


if __name__ == "__main__":
    main()
