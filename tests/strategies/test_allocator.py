"""The allocator is the strategy's business: only a CPU rank whose strategy gathers and frees whole
layers (FSDP, ZeRO-3) fixes glibc's mmap threshold; the launchers leave it to glibc (fixed for every
rank, it made a DDP step 60 % longer)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rankwise import process
from rankwise.launch.ports import set_worker_environment
from rankwise.process import ProcessEnv
from rankwise.strategies import get_strategy
from rankwise.strategies.options import DeepSpeedOptions


@pytest.mark.parametrize(
    ("name", "options", "gathers"),
    [
        ("ddp", None, False),
        ("single", None, False),
        ("fsdp", None, True),
        ("deepspeed", DeepSpeedOptions(zero_stage=2), False),
        ("deepspeed", DeepSpeedOptions(zero_stage=3), True),
    ],
)
def test_each_strategy_says_whether_it_gathers_layers(name, options, gathers):
    strategy = get_strategy(name)(ProcessEnv(), options=options)
    assert strategy.gathers_layers is gathers


@pytest.mark.parametrize(("name", "fixed"), [("ddp", False), ("fsdp", True)])
def test_joining_fixes_the_threshold_only_where_the_strategy_gathers_layers(
    monkeypatch, name, fixed
):
    calls = []
    monkeypatch.setattr(process, "fix_mmap_threshold", lambda *a: calls.append(a) or True)
    monkeypatch.setattr(process, "init_process_group", lambda *a, **k: None)
    strategy = get_strategy(name)(ProcessEnv())
    strategy.device = torch.device("cpu")
    strategy.setup_environment()
    assert bool(calls) is fixed


def test_the_launchers_leave_the_allocator_alone(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    set_worker_environment(2)
    assert "MALLOC_MMAP_THRESHOLD_" not in os.environ


@pytest.mark.multiproc
def test_the_threshold_is_set_on_glibc_unless_the_user_set_one():
    code = "from rankwise.process import fix_mmap_threshold as f; print(f())"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    ours = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    theirs = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "MALLOC_MMAP_THRESHOLD_": "65536"},
        capture_output=True,
        text=True,
    )
    assert (ours.stdout.strip(), theirs.stdout.strip()) == ("True", "False"), ours.stderr
