"""A stop on a CUDA GPU while the model compiles: the run measured on an H200 (torch 2.11) was still
alive 250 s after a SIGTERM sent into its compiled run.  Here a SIGTERM 3 s into the first
compiled step ends the run within 30 s (Slurm's KillWait, torchrun's grace), exit 143, and says
why.  Skipped without CUDA; the same stop on the CPU is tests/train/test_preemption.py."""

from __future__ import annotations

import subprocess

import pytest
import torch

from tests.support.cli import (
    RANK_VARIABLES,
    command,
    command_env,
    sigterm_in_first_step,
    tiny_text,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check)"),
]


def test_sigterm_while_the_first_compiled_step_compiles_on_cuda_ends_the_run_within_30_s(
    tmp_path,
):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        command(
            "train",
            *tiny_text(limit=600, max_length=64),
            "--model",
            "tiny",
            "--precision",
            "bf16-mixed",
            "--max-steps",
            "20",
            "--no-progress",
            "--set",
            "compile=true",
            "--out",
            str(out),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # (a first compile: inductor's on-disk caches would make it fast)
        env=command_env(
            (*RANK_VARIABLES, "LOCAL_RANK"), src=True, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1"
        ),
    )
    stderr, waited = sigterm_in_first_step(proc, out, start_s=180)
    print(f"ended {waited:.1f} s after SIGTERM on {torch.cuda.get_device_name()}")
    assert proc.returncode == 143, stderr[-3000:]
    assert waited < 30, waited
    assert "stopped by" in stderr, stderr[-3000:]  # at a step boundary, or after the grace
