"""`rankwise plan` end to end: refusals before anything runs, and an 8B model planned without
allocating it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rankwise import cli
from tests.support.cli import ROOT, command_env, rankwise

LLAMA = ROOT / "examples/llama_pretrain.py"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.py"], "missing.py: no such script"),
        ([str(LLAMA), "--strategies", "ddp,nope"], "no model of nope"),
        ([str(LLAMA), "--nproc-per-node", "8,x"], "comma-separated list of positive integers"),
        ([str(LLAMA), "--headroom", "1.5"], "--headroom 1.5"),
        ([str(LLAMA), "--micro-batch", "0"], "--micro-batch 0"),
        (
            [str(LLAMA), "--comm", "missing.json"],
            f"--comm {Path.cwd() / 'missing.json'}: no such file",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_runs(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(
        "rankwise.tools.plan.capture.from_script", lambda *a: pytest.fail("something ran")
    )
    assert cli.main(["plan", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.multiproc
def test_an_8b_model_too_large_for_this_machine_is_planned_without_allocating_it(tmp_path):
    """Llama 3 8B's shape: 32 GB of fp32 parameters on a machine of 24 GB, planned in a process of
    under 4 GB."""
    out = tmp_path / "plan"
    env = command_env((), src=True)
    proc = rankwise(
        "plan",
        str(LLAMA),
        "--device",
        "h100",
        "--precision",
        "bf16-mixed",
        "--nproc-per-node",
        "8,64",
        "--micro-batch",
        "1",
        "--strategies",
        "ddp,deepspeed-zero3",
        "--out",
        str(out),
        "--json",
        "--",
        "--size",
        "8b",
        "--length",
        "256",
        env=env,
        timeout=600,
        cwd=None,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["model"]["parameters"] == pytest.approx(8.03e9, rel=1e-3)
    assert plan["peak_rss_mb"] < 4096
    assert (out / "plan.png").stat().st_size > 10_000 and "| deepspeed-zero3 | 64 |" in (
        out / "plan.md"
    ).read_text()
    rows = {(r["strategy"], r["world_size"]): r for r in plan["rows"]}
    ddp = rows[("ddp", 8)]
    # 128 GB of model states alone: shard them.  The cheapest change is the least sharding that
    # fits: ZeRO-1 holds 2 + 2 + 12/8 bytes a parameter (44 GB of the 72 usable) and exchanges
    # less than ZeRO-3, which gathers every layer twice a step.
    assert not ddp["fits"] and ddp["change"].startswith("deepspeed-zero1 at 8 ranks")
    numels = [p for p in _llama_8b_numels()]
    shards = sum(math.ceil(n / 64) for n in numels)
    zero3 = rows[("deepspeed-zero3", 64)]["memory"]
    # ZeRO paper: 2 + 12 bytes
    assert (zero3["gradients"], zero3["optimizer"]) == (2 * shards, 12 * shards)
    # small ones stay whole
    assert zero3["parameters"] == 2 * (shards + sum(n for n in numels if n < 100_000))
    assert json.loads(proc.stdout.strip().splitlines()[-1])["fastest"]["8"] == "deepspeed-zero3"


def _llama_8b_numels() -> list[int]:
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


def test_validate_refuses_a_script_that_starts_its_own_job_before_measuring_anything(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(
        "rankwise.tools.plan.validate.comm_bench", lambda *a: pytest.fail("calibrated")
    )
    script = ROOT / "tests/support/tools/watch/scripts/tutorial_ddp.py"
    assert (
        cli.main(
            ["plan", str(script), "--validate", "--nproc-per-node", "1", "--out", str(tmp_path)]
        )
        == 2
    )
    assert "needs a script on rankwise.setup()" in capsys.readouterr().err


def test_the_ddp_tutorial_script_plans_as_written_and_a_tie_goes_to_the_smaller_memory(
    tmp_path, capsys
):
    """PyTorch's DDP tutorial (torchrun's variables, DDP(model), a 21-parameter model): planned for
    H100s. Every strategy's step is the same to the nanosecond; the fastest named is the one needing
    least memory (DDP's few KiB), not ZeRO-3 with its 19 MiB of buffers."""
    script = ROOT / "tests/support/tools/watch/scripts/tutorial_ddp.py"
    assert (
        cli.main(
            [
                "plan",
                str(script),
                "--nproc-per-node",
                "8",
                "--device",
                "h100",
                "--out",
                str(tmp_path),
                "--json",
            ]
        )
        == 0
    )
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["model"]["parameters"] == 21 and plan["fastest"]["8"] == "ddp"
    assert "fastest that fits: ddp" in capsys.readouterr().out
