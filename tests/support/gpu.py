"""What the GPU tests share: a `rankwise` command in a fresh process, a small `rankwise train`, weight differences."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
STEPS = 8


def rankwise(*args: str, cpu: bool = False, timeout: int = 300) -> subprocess.CompletedProcess:
    """``rankwise ARGS`` in a fresh process (``cpu``: with CUDA hidden from it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["TOKENIZERS_PARALLELISM"] = "false"
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, "-m", "rankwise.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def train(out: Path, data_cache: Path, *args: str, cpu: bool = False) -> dict:
    """A small `rankwise train --json` on the built-in sentiment data; its summary (the last stdout line)."""
    proc = rankwise("train", "--data", "sentiment", "--model", "tiny", "--max-steps", str(STEPS), "--batch-size", "16",
                    "--out", str(out), "--json", "--no-progress", "--set", "data.limit=600",
                    "--set", "data.max_length=48", "--set", "data.tokenizer=char", "--set", "eval_batch_size=128",
                    "--set", "dev_each_epoch=false", "--set", f"data.cache_dir={json.dumps(str(data_cache))}",
                    *args, cpu=cpu)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == STEPS and 0.0 <= summary["accuracy"] <= 1.0, summary
    return summary


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)
