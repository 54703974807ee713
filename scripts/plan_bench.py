"""rankwise plan's benchmark (issue 40's targets), printed, not asserted by a timed test.

1. Llama-3-8B's shape planned for ddp, fsdp and deepspeed-zero1..3 at 8, 64 and 512 ranks on H100s
   (bf16-mixed, one 4096-token sequence a rank): the command's wall time and peak resident memory
   (targets: under 2 minutes and 4 GB on 2 cores), and every parameters / gradients / optimizer row
   against its closed form (ZeRO paper's 2 + 2 + 12 bytes per parameter, partitioned by stage; DDP
   and FSDP keep fp32 parameters under autocast: 4 + 4 + 8).
2. ``rankwise plan --validate`` on the built-in model and on examples/causal_lm.py at 1 and 2 ranks
   (targets: memory within 10 %, step time within 25 %).

    python scripts/plan_bench.py [--skip-validate] [--out runs/plan-bench]
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = "ddp,fsdp,deepspeed-zero1,deepspeed-zero2,deepspeed-zero3"


def llama_8b_numels() -> list[int]:
    """Every parameter's elements in examples/llama_pretrain.py --size 8b (Llama 3 8B's shape)."""
    hidden, inter, layers, vocab, kv = 4096, 14336, 32, 128256, 8 * 128
    layer = [
        hidden * hidden,
        hidden * kv,
        hidden * kv,
        hidden * hidden,
        inter * hidden,
        inter * hidden,
        hidden * inter,
        hidden,
        hidden,
    ]
    return [vocab * hidden] + layer * layers + [hidden, vocab * hidden]


def closed_forms(strategy: str, world: int) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer) bytes a rank keeps, in closed form."""
    numels = llama_8b_numels()
    phi = sum(numels)
    if strategy == "ddp":
        # fp32 under autocast; AdamW's step count per tensor
        return 4 * phi, 4 * phi, 8 * phi + 4 * len(numels)
    if strategy == "fsdp":  # FSDP2 pads each parameter's dim 0 to a multiple of N
        return None  # measured on fake ranks: checked against its own padded closed form below
    if strategy == "deepspeed-zero3":
        shards = sum(math.ceil(n / world) for n in numels)
        whole = sum(n for n in numels if n < 100_000)  # stage3_param_persistence_threshold
        return 2 * (shards + whole), 2 * shards, 12 * shards
    part = math.ceil(phi / (2 * world)) * 2  # the flat buffer padded to 2N elements, split N ways
    grads = 2 * part * world if strategy == "deepspeed-zero1" else 2 * part
    return 2 * part * world, grads, 12 * part


def plan_8b(out: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "rankwise.cli",
        "plan",
        str(ROOT / "examples/llama_pretrain.py"),
        "--nproc-per-node",
        "8,64,512",
        "--device",
        "h100",
        "--precision",
        "bf16-mixed",
        "--micro-batch",
        "1",
        "--strategies",
        STRATEGIES,
        "--out",
        str(out),
        "--",
        "--size",
        "8b",
        "--length",
        "4096",
    ]
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    rss_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2
    if proc.returncode:
        sys.exit(f"the 8B plan failed:\n{proc.stderr[-3000:]}")
    print(proc.stdout)
    print(
        f"8B plan: {wall:.1f} s wall (target < 120 s), peak RSS {rss_gb:.2f} GB (target < 4 GB)\n"
    )
    rows = json.loads((out / "plan.json").read_text())["rows"]
    print(f"{'strategy':16s} {'ranks':>5s}  rows (params/grads/optim bytes) against closed form")
    for row in rows:
        memory = row["memory"]
        got = (memory["parameters"], memory["gradients"], memory["optimizer"])
        want = closed_forms(row["strategy"], row["world_size"])
        # fsdp: FSDP2 pads dim 0 of each parameter to a multiple of N (rank 0's shard is full)
        if want is None:
            world, shapes = row["world_size"], fsdp_shapes()
            padded = sum(math.ceil(d0 / world) * rest for d0, rest in shapes)
            # + AdamW's step count per tensor
            want = (4 * padded, 4 * padded, 8 * padded + 4 * len(shapes))
        verdict = "exact" if got == want else f"DIFFERS: expected {want}"
        print(f"{row['strategy']:16s} {row['world_size']:5d}  {got} {verdict}")


def fsdp_shapes() -> list[tuple[int, int]]:
    """(dim 0, elements per dim-0 row) of each parameter of the 8B shape."""
    hidden, inter, layers, vocab, kv = 4096, 14336, 32, 128256, 8 * 128
    layer = [
        (hidden, hidden),
        (kv, hidden),
        (kv, hidden),
        (hidden, hidden),
        (inter, hidden),
        (inter, hidden),
        (hidden, inter),
        (hidden, 1),
        (hidden, 1),
    ]
    return [(vocab, hidden)] + layer * layers + [(hidden, 1), (vocab, hidden)]


def validate(out: Path) -> None:
    for name, args in (
        ("builtin_model.py", []),
        ("causal_lm.py", ["--out", str(out / "causal-lm-outputs")]),
    ):
        command = [
            sys.executable,
            "-m",
            "rankwise.cli",
            "plan",
            str(ROOT / "examples" / name),
            "--validate",
            "--out",
            str(out / name.removesuffix(".py")),
            "--",
            *args,
        ]
        proc = subprocess.run(command, capture_output=True, text=True)
        table = out / name.removesuffix(".py") / "validate.md"
        print(f"== rankwise plan --validate examples/{name} (exit {proc.returncode})")
        print(table.read_text() if table.is_file() else proc.stderr[-3000:])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("runs/plan-bench"))
    parser.add_argument("--skip-validate", action="store_true")
    args = parser.parse_args()
    plan_8b(args.out / "llama-8b")
    if not args.skip_validate:
        validate(args.out)


if __name__ == "__main__":
    main()
