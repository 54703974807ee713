"""What the GPU tests share: a `rankwise` command in a fresh process, a small `rankwise train`,
weight differences."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support import cli
from tests.support.cli import RANK_VARIABLES, command_env, tiny_text

STEPS = 8


def rankwise(*args: str, cpu: bool = False, timeout: int = 300) -> subprocess.CompletedProcess:
    """``rankwise ARGS`` in a fresh process (``cpu``: with CUDA hidden from it)."""
    env = command_env(
        (*RANK_VARIABLES, "LOCAL_RANK"),
        TOKENIZERS_PARALLELISM="false",
        **({"CUDA_VISIBLE_DEVICES": ""} if cpu else {}),
    )
    return cli.rankwise(*args, env=env, timeout=timeout)


def train(out: Path, data_cache: Path, *args: str, cpu: bool = False) -> dict:
    """A small `rankwise train --json` on the built-in sentiment data; its summary (the last stdout
    line)."""
    proc = rankwise(
        "train",
        *tiny_text(limit=600, max_length=48, eval_batch_size=128),
        "--model",
        "tiny",
        "--max-steps",
        str(STEPS),
        "--batch-size",
        "16",
        "--out",
        str(out),
        "--json",
        "--no-progress",
        "--set",
        "dev_each_epoch=false",
        "--set",
        f"data.cache_dir={json.dumps(str(data_cache))}",
        *args,
        cpu=cpu,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    summary = cli.json_summary(proc)
    assert summary["steps"] == STEPS and 0.0 <= summary["accuracy"] <= 1.0, summary
    return summary


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)
