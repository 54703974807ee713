import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rankwise.measure.tolerance import max_param_diff
from tests.support.cli import ROOT, command_env, rankwise

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)

EXAMPLE = ROOT / "examples" / "random_data_ddp.py"


def _env():
    return command_env(PYTHONPATH=str(ROOT))


def _launch(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return rankwise(
        "launch",
        "--nproc-per-node",
        "2",
        str(EXAMPLE),
        "--samples",
        "512",
        "--out",
        str(out),
        *extra,
        env=_env(),
        timeout=120,
        cwd=None,
    )


def test_random_data_example_runs_on_two_ranks_and_one(tmp_path):
    proc = _launch(tmp_path / "ddp", "--epochs", "2")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps_per_epoch"] == 512 // 128
    assert "epoch 1: loss" in proc.stdout
    weights = load_file(str(tmp_path / "ddp" / "model.safetensors"))
    assert set(weights) == {"weight", "bias"}  # unwrapped: no module. prefix
    single = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--samples",
            "512",
            "--epochs",
            "2",
            "--out",
            str(tmp_path / "one"),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert single.returncode == 0, single.stderr
    one = load_file(str(tmp_path / "one" / "model.safetensors"))
    assert max_param_diff(weights, one) < 1e-5


@pytest.mark.parametrize("attempt", range(3))
def test_completed_ddp_run_always_exits_zero(tmp_path, attempt):
    """torch 2.13 on gloo aborted ~1 run in 3 at teardown with a live DDP module; rankwise must exit
    0 every time. Three attempts miss a 1-in-3 abort with probability 30%, but the dozens of other
    2-rank runs in the suite that assert exit 0 (train, launch, bench, verify) would fail on it too
    (measured separately: 20 of 20 runs exited 0)."""
    proc = _launch(tmp_path, "--epochs", "1")
    assert proc.returncode == 0, f"attempt {attempt}: exit {proc.returncode}\n{proc.stderr[-3000:]}"


def _run_example(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_plain_ddp_script_runs_unchanged_under_rankwise_launch(tmp_path):
    """A torchrun-style script with no rankwise import: every rank joins one group and the replicas
    stay equal."""
    script = ROOT / "examples" / "plain_ddp_torchrun.py"
    proc = rankwise(
        "launch",
        "--nproc-per-node",
        "2",
        str(script),
        "--steps",
        "5",
        "--out",
        str(tmp_path),
        env=_env(),
        timeout=120,
        cwd=None,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    # Different random batches per rank, yet identical weights: DDP averaged the gradients.
    assert ranks[0]["parameter_sum"] == ranks[1]["parameter_sum"]
    import torch

    initial = sum(p.double().sum().item() for p in _toy_model_with_seed_0().parameters())
    assert abs(ranks[0]["parameter_sum"] - initial) > 1e-6  # it trained
    assert set(torch.load(tmp_path / "toy.pt")) == {
        "net1.weight",
        "net1.bias",
        "net2.weight",
        "net2.bias",
    }


def _toy_model_with_seed_0():
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location(
        "plain_ddp_torchrun", ROOT / "examples" / "plain_ddp_torchrun.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module.ToyModel()


def test_toy_mp_spawn_example_saves_unwrapped_weights_once(tmp_path):
    proc = _run_example("toy_mp_spawn.py", "--out", str(tmp_path), "--steps", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text()) == {"world_size": 2, "steps": 5}
    assert set(load_file(str(tmp_path / "toy.safetensors"))) == {
        "net1.weight",
        "net1.bias",
        "net2.weight",
        "net2.bias",
    }
    assert proc.stdout.count("rank 0 saved") == 1  # printed by the main process only


def test_long_sequence_example_accumulates_and_saves_periodically(tmp_path):
    proc = _run_example(
        "long_sequence_accumulation.py",
        "--max-steps",
        "2",
        "--save-every",
        "1",
        "--documents",
        "64",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("step-*.safetensors")) == [
        "step-1.safetensors",
        "step-2.safetensors",
    ]
    assert "on 64 documents of up to 512 tokens; 2 processes x 2 x 4 accumulation" in proc.stdout
    assert any((tmp_path / "tensorboard").iterdir())


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("builtin_model.py", ["--steps", "3", "--samples", "64"]),
        ("llama_pretrain.py", ["--steps", "10", "--samples", "64"]),
    ],
)
def test_the_planning_examples_train_in_one_process(name, args):
    """The scripts rankwise plan's how-to plans (the built-in model; a Llama at a size that trains
    here)."""
    proc = _run_example(name, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loss" in proc.stdout
