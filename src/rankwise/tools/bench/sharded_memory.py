"""Peak memory per rank of the sharded strategies against DDP, on a large model.

Trains a few steps of a BERT preset (default ``large``, ~310M parameters) with ``ddp``,
``fsdp`` and ``deepspeed`` ZeRO-3, each as ``rankwise train ... --json``, and prints each
rank's peak resident memory during training (model construction included; the final
evaluation and checkpoint excluded) and its ratio to DDP's, then the overall peak with the
checkpoint (full weights are gathered onto rank 0 for it, a bucket at a time)::

    python -m rankwise.tools.bench.sharded_memory                         # large, 2 ranks
    python -m rankwise.tools.bench.sharded_memory --model base --nproc 4  # ~90M, 4 ranks
    python -m rankwise.tools.bench.sharded_memory --model base --activation-checkpointing

With ``--activation-checkpointing`` each strategy also runs with
``model.activation_checkpointing=true``, on long texts (``--max-length``, default 512 then: the
reviews repeated to fill it, a long-document job), and the table gives each run's peak against the
same strategy without it.

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
import csv
import json
import random
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
    """``rankwise train --strategy STRATEGY ... --json`` in fresh processes; its summary, or
    ``{"error"}``."""
    with tempfile.TemporaryDirectory(prefix=f"rankwise-{strategy}-") as out:
        procs = ["--nproc-per-node", str(nproc)] if get_strategy(strategy).multiprocess else []
        return {
            "strategy": strategy,
            **run_train(["--strategy", strategy, *procs, *extra], Path(out)),
        }


def long_texts(path: Path, length: int, count: int) -> Path:
    """A CSV of ``count`` sentiment reviews, each repeated to ``length`` characters: every text
    fills the model's ``length`` tokens under the character tokenizer."""
    from rankwise.data.sentiment import load_sentiment

    records = load_sentiment()
    chosen = random.Random(0).sample(records, count)
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        for record in chosen:
            writer.writerow(
                [(record.text * (length // max(len(record.text), 1) + 1))[:length], record.label]
            )
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="large", help="BERT preset (default large, ~310M parameters)"
    )
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument(
        "--strategies",
        default=",".join(CASES),
        help=f"strategies to measure, ddp first as the base (default {','.join(CASES)})",
    )
    parser.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="also run each strategy with model.activation_checkpointing=true, on long texts",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="tokens per text (default 32; 512 with --activation-checkpointing)",
    )
    parser.add_argument(
        "--batch-per-rank", type=int, default=2, help="samples per rank per step (default 2)"
    )
    args, extra = parser.parse_known_args(argv)
    max_length = args.max_length or (512 if args.activation_checkpointing else 32)
    cases = [name.strip() for name in args.strategies.split(",") if name.strip()]
    if cases[:1] != ["ddp"]:
        parser.error("--strategies must start with ddp: the others are compared with it")
    with tempfile.TemporaryDirectory(prefix="rankwise-memory-") as scratch:
        data = (
            str(long_texts(Path(scratch) / "long.csv", max_length, 64))
            if max_length > 32
            else "sentiment"
        )
        job = [
            "--data",
            data,
            "--model",
            args.model,
            "--max-steps",
            str(args.steps),
            "--precision",
            args.precision,
            "--batch-size",
            str(args.batch_per_rank * args.nproc),
            "--set",
            f"data.max_length={max_length}",
            "--set",
            "data.limit=64",
            "--set",
            "model.dropout=0",
            # Long texts: every character a token (each text fills max_length), the transformer
            # alone.
            *(
                ["--set", "data.tokenizer=char", "--set", "data.char_ngrams=0"]
                if max_length > 32
                else []
            ),
            *extra,
        ]
        runs = [
            (label, ac)
            for label in cases
            for ac in ((False, True) if args.activation_checkpointing else (False,))
        ]
        print(
            f"{args.model} model, {args.nproc} ranks x {args.batch_per_rank} texts of {max_length} "
            f"tokens, {args.precision}, {args.steps} steps\n"
        )
        print(
            "| strategy | parameters | peak RSS per rank in training (MB) | max / DDP | max / "
            "without AC | overall peak per rank, checkpoint included (MB) | samples/s |"
        )
        print("|---|---:|---|---:|---:|---|---:|")
        rows, peaks = {}, {}
        for label, ac in runs:  # ddp first: the others are compared with it as they finish
            name = f"{label}+ac" if ac else label
            row = rows[name] = run(
                label,
                args.nproc,
                job + (["--set", "model.activation_checkpointing=true"] if ac else []),
            )
            if "error" in row:
                print(f"| {name} | | failed: {row['error']} | | | | |", flush=True)
                continue
            peaks[name] = max(train for train, _ in row["peak_rss_mb"])
            base = "ddp+ac" if ac else "ddp"
            ratio = f"{peaks[name] / peaks[base]:.2f}" if base in peaks else "n/a"
            without = f"{peaks[name] / peaks[label]:.2f}" if ac and label in peaks else ""
            training = ", ".join(f"{t:.0f}" for t, _ in row["peak_rss_mb"])
            other = ", ".join(f"{o:.0f}" for _, o in row["peak_rss_mb"])
            print(
                f"| {name} | {row['parameters']:,} | {training} | {ratio} | {without} | {other} | "
                f"{row['samples_per_s']} |",
                flush=True,
            )
    for name in [
        name for name in peaks if name != "ddp" and "ddp" in peaks and not name.endswith("+ac")
    ]:
        ratio = peaks[name] / peaks["ddp"]
        print(
            f"{name}: {ratio:.2f} x DDP ({'meets' if ratio <= GOAL else 'misses'} the <= {GOAL} "
            "goal)"
        )
    for name in [name for name in peaks if name.endswith("+ac") and name[:-3] in peaks]:
        print(
            f"{name}: {peaks[name]:.0f} MB against {peaks[name[:-3]]:.0f} MB without activation "
            f"checkpointing ({peaks[name] - peaks[name[:-3]]:+.0f} MB)"
        )
    print(
        json.dumps(
            {
                "model": args.model,
                "nproc": args.nproc,
                "precision": args.precision,
                "max_length": max_length,
                "runs": rows,
                **machine(),
            }
        )
    )


if __name__ == "__main__":
    main()
