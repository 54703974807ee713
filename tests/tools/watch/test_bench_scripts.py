"""`rankwise bench --script` on scripts as users write them: a row per world size, each with the
watcher's throughput and memory and `rankwise verify`'s equivalence; the fastest passing row
named."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[2] / "support" / "tools" / "watch" / "scripts"


def _bench(out: Path, script: str, *flags: str) -> tuple[int, str, dict]:
    from rankwise import cli

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(
            [
                "bench",
                "--script",
                str(SCRIPTS / script),
                "--nproc-per-node",
                "1,2",
                "--steps",
                "6",
                "--verify-steps",
                "3",
                "--min-window",
                "0",
                "--out",
                str(out),
                *flags,
            ]
        )
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return code, stdout.getvalue() + stderr.getvalue()[-3000:], report


@pytest.mark.multiproc
def test_accelerates_quick_tour_gets_a_row_per_world_size_and_a_passing_equivalence_column(
    tmp_path,
):
    code, output, report = _bench(tmp_path, "accelerate_tour.py")
    assert code == 0, output
    rows = {row["row"]: row for row in report["rows"]}
    assert list(rows) == ["accelerate x1", "accelerate x2"]
    assert rows["accelerate x1"]["verdict"] == "reference"
    two = rows["accelerate x2"]
    assert two["verdict"] == "equivalent" and two["max_gradient_diff"] < 1e-6, two
    assert (
        two["samples_per_s"] > 0
        and len(two["peak_rss_mb"]) == 2
        and two["strategy"] == "DDP (Accelerate, CPU)"
    )
    assert "without a GPU Accelerate runs DDP only" in output
    _fastest_named(report, output, rows)


@pytest.mark.multiproc
def test_a_plain_ddp_scripts_defective_form_fails_its_row_with_the_finding(tmp_path):
    code, output, report = _bench(
        tmp_path, "plain_ddp.py", "--verify-steps", "6", "--", "--defective"
    )
    assert code == 1, output
    two = next(row for row in report["rows"] if row["processes"] == 2)
    assert two["verdict"] == "not equivalent" and "set_epoch was never called" in two["reason"]
    assert "torch script, started as torchrun would start it" in output


def test_strategies_are_refused_before_anything_runs_for_a_script_that_chooses_its_own(
    tmp_path, capsys
):
    from rankwise import cli

    code = cli.main(
        [
            "bench",
            "--script",
            str(SCRIPTS / "plain_ddp.py"),
            "--strategies",
            "fsdp",
            "--out",
            str(tmp_path),
        ]
    )
    assert (
        code == 2
        and "plain_ddp.py is a torch script, which sets its own strategy" in capsys.readouterr().err
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.multiproc
def test_a_fabric_loop_gets_world_size_rows_that_pass(tmp_path):
    code, output, report = _bench(tmp_path, "fabric_loop.py")
    assert code == 0, output
    rows = {row["row"]: row for row in report["rows"]}
    assert list(rows) == ["fabric x1", "fabric x2"] and rows["fabric x2"]["verdict"] == "equivalent"
    assert rows["fabric x2"]["samples_per_s"] > 0
    _fastest_named(report, output, rows)
    # The model's FLOPs, counted in the first step: Linear(16, 32) and Linear(32, 2), 2 FLOPs a
    # multiply-add; forward 1,152 a sample, the weights' gradients as many, the input gradient of
    # the second layer 128.
    for row in rows.values():
        # --min-window 0: the steps asked, once
        assert row["pooled_runs"] == 1 and row["timed_steps"] == 5, row
        assert row["flops_counted"] == "first step"
        assert abs(row["tflops_per_s"] * 1e12 / row["samples_per_s"] - 2432) < 1, row
        assert 0 < row["mfu"] < 1, row
    assert "TFLOP/s: the model FLOPs torch's counter saw" in output


@pytest.mark.multiproc
def test_fabric_strategies_are_rows_through_its_launch_setting_and_one_it_cannot_run_here_says_why(
    tmp_path,
):
    code, output, report = _bench(tmp_path, "fabric_loop.py", "--strategies", "ddp,fsdp")
    rows = {row["row"]: row for row in report["rows"]}
    assert list(rows) == ["fabric x1", "fabric ddp x2", "fabric fsdp x2"], output
    assert (
        rows["fabric ddp x2"]["verdict"] == "equivalent"
        and rows["fabric ddp x2"]["strategy"] == "Fabric's ddp"
    )
    # Fabric's own refusal, from the run (this machine has no GPU), not a rankwise guess.
    fsdp = rows["fabric fsdp x2"]
    assert (
        fsdp["status"] == "could not run" and "FSDP is only available on GPU" in fsdp["reason"]
    ), fsdp
    assert code == 4
    _fastest_named(report, output, ("fabric x1", "fabric ddp x2"))


def _fastest_named(report: dict, output: str, among) -> None:
    """The fastest passing row is named among ``among``, or, where the suite's other worker
    disturbed rows (their measured peak fell: the bench is right to say so), each disturbed row is
    named as such and left out."""
    disturbed = {line["row"] for line in report["rows"] if line.get("disturbed")}
    for name in disturbed:
        assert f"- {name}: disturbed, not a figure to trust" in output, output
    if report["fastest"] is None:
        assert disturbed, output
    else:
        assert report["fastest"] in among and report["fastest"] not in disturbed, report["fastest"]
        assert f"fastest row that passes: {report['fastest']}" in output


def test_framework_strategy_names_are_checked_before_anything_runs(tmp_path, capsys):
    from rankwise import cli

    code = cli.main(
        [
            "bench",
            "--script",
            str(SCRIPTS / "fabric_loop.py"),
            "--strategies",
            "zero9",
            "--out",
            str(tmp_path),
        ]
    )
    assert (
        code == 2
        and "not a strategy `fabric run --strategy` takes here; one of ddp"
        in capsys.readouterr().err
    )
    code = cli.main(
        [
            "bench",
            "--script",
            str(SCRIPTS / "plain_ddp.py"),
            "--strategies",
            "ddp",
            "--out",
            str(tmp_path),
        ]
    )
    assert (
        code == 2
        and "plain_ddp.py is a torch script, which sets its own strategy in its code"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "runs").exists()


def test_accelerate_strategies_on_a_machine_without_a_gpu_are_rows_that_say_why_they_did_not_run(
    monkeypatch,
):
    import torch

    from rankwise.tools.bench.user_script import summarize, watched_rows
    from rankwise.tools.watch.frameworks import framework

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rows = watched_rows(framework("accelerate"), [2], ["ddp", "fsdp", "deepspeed"])
    assert [row.name for row in rows] == [
        "accelerate x1",
        "accelerate ddp x2",
        "accelerate fsdp x2",
        "accelerate deepspeed x2",
    ]
    assert [row.missing() is None for row in rows] == [True, True, False, False]
    # (what `accelerate launch --cpu --use_fsdp` hands the script: compat/launchers.py)
    assert rows[2].framework.environment == {
        "ACCELERATE_USE_CPU": "True",
        "ACCELERATE_MIXED_PRECISION": "no",
        "ACCELERATE_DYNAMO_BACKEND": "NO",
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_VERSION": "2",
    }
    # the rows that do not run
    summary = summarize(rows[2:], {row.name: [] for row in rows[2:]}, {})
    fsdp, deepspeed = summary["rows"]
    assert (
        deepspeed["status"] == "not available here"
        and "Accelerate runs DDP only" in deepspeed["reason"]
    )
    assert fsdp["status"] == "not available here" and "Accelerate runs DDP only" in fsdp["reason"]


@pytest.mark.multiproc
def test_a_script_that_ends_during_its_profiled_steps_ends_cleanly(tmp_path):
    """Its profiler, left running at exit, crashed the rank (SIGSEGV) in place of saying the script
    was short."""
    from rankwise.tools.watch.frameworks import framework
    from rankwise.tools.watch.runs import watched_run
    from rankwise.tools.watch.settings import WatchSettings

    result = watched_run(
        SCRIPTS / "accelerate_tour.py",
        [],
        framework("accelerate"),
        2,
        WatchSettings(
            tmp_path, watched_steps=12, warmup=5, trace=False, keep_dropout=True, profile_steps=5
        ),
    )
    assert result.get("ended_early") and "ended after 8 optimizer steps" in result["error"], result
