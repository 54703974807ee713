"""Every strategy on the same job: throughput, peak memory per rank, accuracy.

Each strategy (DeepSpeed at ZeRO stages 1-3, DDP by torchrun and by spawn) runs
``rankwise train ... --json`` end to end on 2 processes (``single`` and ``dp`` on one),
one after another; the table lists samples/s, the peak resident memory of each rank and
the test accuracy.  Flags it does not know go to ``rankwise train``::

    python -m rankwise.bench.strategies                       # tiny model, sentiment, full default run
    python -m rankwise.bench.strategies --epochs 1 --strategies ddp fsdp deepspeed-zero3
    python -m rankwise.bench.strategies --max-steps 100       # quicker: throughput and memory only

(``rankwise.bench.memory`` compares the sharded strategies' memory on a large model.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

from rankwise.bench.common import machine

# Row name -> (strategy, its extra flags): every strategy, DeepSpeed at each ZeRO stage, DDP by both launchers.
VARIANTS = {
    "single": ("single", []),
    "dp": ("dp", []),
    "ddp": ("ddp", []),
    "ddp-spawn": ("ddp", ["--launcher", "spawn"]),
    "fsdp": ("fsdp", []),
    "deepspeed-zero1": ("deepspeed", ["--set", "deepspeed.zero_stage=1"]),
    "deepspeed-zero2": ("deepspeed", ["--set", "deepspeed.zero_stage=2"]),
    "deepspeed-zero3": ("deepspeed", ["--set", "deepspeed.zero_stage=3"]),
    "accelerate": ("accelerate", []),
    "horovod": ("horovod", []),
}
ALL = list(VARIANTS)


def run(variant: str, nproc: int, extra: list[str]) -> dict:
    strategy, flags = VARIANTS[variant]
    extra = [*flags, *extra]
    with tempfile.TemporaryDirectory(prefix=f"rankwise-{variant}-") as out:
        procs = [] if strategy in ("single", "dp") else ["--nproc-per-node", str(nproc)]
        command = [sys.executable, "-m", "rankwise.cli", "train", "--strategy", strategy, *procs, "--out", out,
                   "--json", "--no-progress", *extra]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode:
            return {"strategy": variant, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", nargs="+", default=ALL, choices=ALL)
    parser.add_argument("--nproc", type=int, default=2)
    args, extra = parser.parse_known_args(argv)
    if not any(a == "--data" for a in extra):
        extra = ["--data", "sentiment", *extra]
    rows = []
    print("| run | ranks | parameters | samples/s | peak RSS per rank in training (MB) | overall peak (MB) | "
          "accuracy | wall s |")
    print("|---|---:|---:|---:|---|---|---:|---:|")
    for variant in args.strategies:
        row = run(variant, args.nproc, extra) | {"run": variant}
        rows.append(row)
        if "error" in row:
            print(f"| {variant} | | | | | | | failed: {row['error']} |", flush=True)
            continue
        print(f"| {variant} | {row['world_size']} | {row['parameters']:,} | {row['samples_per_s']} | "
              f"{', '.join(str(t) for t, _ in row['peak_rss_mb'])} | "
              f"{', '.join(str(o) for _, o in row['peak_rss_mb'])} "
              f"| {row['accuracy']:.4f} | {row['wall_s']} |",
              flush=True)
    print(json.dumps({"runs": rows, **machine()}))


if __name__ == "__main__":
    main()
