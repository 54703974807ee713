import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "random_data_ddp.py"


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _launch(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rankwise.cli", "launch", "--nproc-per-node", "2", str(EXAMPLE),
                           "--samples", "512", "--out", str(out), *extra], env=_env(), capture_output=True, text=True,
                          timeout=120)


def test_random_data_example_runs_on_two_ranks_and_one(tmp_path):
    proc = _launch(tmp_path / "ddp", "--epochs", "2")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps_per_epoch"] == 512 // 128
    assert "epoch 1: loss" in proc.stdout
    weights = load_file(str(tmp_path / "ddp" / "model.safetensors"))
    assert set(weights) == {"weight", "bias"}  # unwrapped: no module. prefix
    single = subprocess.run([sys.executable, str(EXAMPLE), "--samples", "512", "--epochs", "2", "--out",
                             str(tmp_path / "one")], env=_env(), capture_output=True, text=True, timeout=120)
    assert single.returncode == 0, single.stderr
    one = load_file(str(tmp_path / "one" / "model.safetensors"))
    assert all((weights[k] - one[k]).abs().max() < 1e-5 for k in weights)


@pytest.mark.parametrize("attempt", range(10))
def test_completed_ddp_run_always_exits_zero(tmp_path, attempt):
    """torch 2.13 on gloo aborted ~1 run in 3 at teardown with a live DDP module; rankwise must exit 0 every time."""
    proc = _launch(tmp_path, "--epochs", "1")
    assert proc.returncode == 0, f"attempt {attempt}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
