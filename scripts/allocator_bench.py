"""Step time and resident memory of a CPU rank with glibc's mmap threshold fixed at 1 MiB and with
glibc's own moving threshold, per strategy: the measurement behind ``Strategy.gathers_layers``.

Each run is ``rankwise train --data sentiment --strategy S --nproc-per-node 2 --json``; the two
allocators alternate, run after run.  "fixed" sets ``MALLOC_MMAP_THRESHOLD_=1048576`` for every
rank (what the launchers did for every strategy before); "glibc" keeps glibc's moving threshold,
even for a strategy that would fix it (a ``sitecustomize`` turns ``fix_mmap_threshold`` off).
Prints, per strategy and allocator, the median steady step time and each rank's peak RSS while
training::

    python scripts/allocator_bench.py --model small --steps 20 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SITECUSTOMIZE = """
import os
if os.environ.get("RANKWISE_ALLOCATOR") == "glibc":
    import rankwise.process
    rankwise.process.fix_mmap_threshold = lambda *args, **kwargs: False
"""


def run(strategy: str, allocator: str, args: argparse.Namespace, site: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    env["RANKWISE_ALLOCATOR"] = allocator
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    if allocator == "fixed":
        env["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    with tempfile.TemporaryDirectory(prefix="rankwise-allocator-") as out:
        command = [
            sys.executable, "-m", "rankwise.cli", "train", "--data", "sentiment",
            "--model", args.model, "--strategy", strategy, "--nproc-per-node", "2",
            "--max-steps", str(args.steps), "--batch-size", "32", "--out", out, "--json",
            "--no-progress",
            "--set", "dev_each_epoch=false", "--set", f"data.cache_dir={args.cache}",
        ]  # fmt: skip
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{strategy} ({allocator}) failed:\n{proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "step_ms": 1000 * 32 / summary["steady_samples_per_s"],
        "rss_mb": [round(training) for training, _ in summary["peak_rss_mb"]],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--strategies", default="ddp,fsdp,deepspeed-zero3")
    parser.add_argument("--model", default="small")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "rankwise-alloc-data"))
    args = parser.parse_args(argv)
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as site:
        Path(site, "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
        for repeat in range(args.repeats):
            for strategy in args.strategies.split(","):
                order = ("fixed", "glibc") if repeat % 2 == 0 else ("glibc", "fixed")
                for allocator in order:
                    result = run(strategy, allocator, args, Path(site))
                    results.setdefault((strategy, allocator), []).append(result)
                    print(f"{strategy} {allocator}: {result}", file=sys.stderr, flush=True)
    print(f"model {args.model}, {args.steps} steps, 2 ranks x 1 thread, medians of {args.repeats}")
    print("| strategy | allocator | step ms | peak RSS MB / rank (each run) |")
    print("|---|---|---:|---|")
    for (strategy, allocator), runs in results.items():
        step = statistics.median(r["step_ms"] for r in runs)
        rss = "; ".join(", ".join(str(mb) for mb in r["rss_mb"]) for r in runs)
        print(f"| {strategy} | {allocator} | {step:.1f} | {rss} |")


if __name__ == "__main__":
    main()
