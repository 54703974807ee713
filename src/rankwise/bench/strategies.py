"""Every strategy on the same job: throughput, peak memory per rank, accuracy.

Each registered strategy or variant (DeepSpeed at ZeRO stages 1-3, DDP by torchrun and
by spawn) runs ``rankwise train --strategy NAME ... --json`` end to end on 2 processes
(one-process strategies such as ``single`` and ``dp`` on one),
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
from rankwise.strategies import get_strategy, strategy_names

DEFAULT = ["single", "dp", "ddp", "ddp-spawn", "fsdp", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3",
           "accelerate", "horovod"]
"""Every strategy once, DeepSpeed at each sharding ZeRO stage, DDP by both launchers (registered variants)."""


def run(strategy: str, nproc: int, extra: list[str]) -> dict:
    """``rankwise train --strategy STRATEGY ... --json`` in a fresh process; its summary, or ``{"error"}``."""
    with tempfile.TemporaryDirectory(prefix=f"rankwise-{strategy}-") as out:
        procs = ["--nproc-per-node", str(nproc)] if get_strategy(strategy).multiprocess else []
        command = [sys.executable, "-m", "rankwise.cli", "train", "--strategy", strategy, *procs, "--out", out,
                   "--json", "--no-progress", *extra]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode:
            return {"strategy": strategy, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", nargs="+", default=DEFAULT, choices=strategy_names())
    parser.add_argument("--nproc", type=int, default=2)
    args, extra = parser.parse_known_args(argv)
    if not any(a == "--data" for a in extra):
        extra = ["--data", "sentiment", *extra]
    rows = []
    print("| run | ranks | parameters | samples/s | peak RSS per rank in training (MB) | overall peak (MB) | "
          "accuracy | wall s |")
    print("|---|---:|---:|---:|---|---|---:|---:|")
    for name in args.strategies:
        row = run(name, args.nproc, extra) | {"run": name}
        rows.append(row)
        if "error" in row:
            print(f"| {name} | | | | | | | failed: {row['error']} |", flush=True)
            continue
        print(f"| {name} | {row['world_size']} | {row['parameters']:,} | {row['samples_per_s']} | "
              f"{', '.join(str(t) for t, _ in row['peak_rss_mb'])} | "
              f"{', '.join(str(o) for _, o in row['peak_rss_mb'])} "
              f"| {row['accuracy']:.4f} | {row['wall_s']} |",
              flush=True)
    print(json.dumps({"runs": rows, **machine()}))


if __name__ == "__main__":
    main()
