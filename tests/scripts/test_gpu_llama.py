"""scripts/gpu_llama.py, the GPU pass's Llama speed check, runs here on the CPU at the tiny size."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.cli import ROOT, command_env


@pytest.mark.multiproc
def test_the_llama_speed_check_times_both_loops_and_writes_every_number(tmp_path):
    out = tmp_path / "llama.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gpu_llama.py"), "--device", "cpu", "--size", "tiny"]
        + ["--length", "32", "--batch-size", "4", "--steps", "2", "--warmup", "1", "--pairs", "1"]
        + ["--no-compile", "--json-out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=command_env((), src=True),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    # (the tiny model's step: its matrix products and its attention, counted on the CPU)
    assert result["flops_per_step"] > 6 * 4 * 32 * 64 * 64
    for loop in ("rankwise", "plain"):
        assert result[loop]["step_s"] > 0 and result[loop]["tokens_per_s"] > 0
    assert len(result["rankwise_over_plain"]) == 1
    assert "rankwise / plain (throughput, median of 1 pairs)" in proc.stdout
