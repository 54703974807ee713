"""``rankwise launch --strategy / --precision / --set``: the script's ``rankwise.setup()`` takes
them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rankwise import cli
from rankwise.errors import ConfigError
from rankwise.launch.choice import OPTIONS, PRECISION, STRATEGY, Choice, settle
from tests.support.cli import ROOT, command_env, rankwise

PROBE = str(Path(__file__).parents[1] / "support" / "launch" / "strategy_probe.py")


def _launch(
    out: Path, *flags: str, script_args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    return rankwise(
        "launch",
        "--nproc-per-node",
        "2",
        *flags,
        PROBE,
        str(out),
        *script_args,
        env=command_env(PYTHONPATH=str(ROOT)),
        timeout=180,
        cwd=None,
    )


def _ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.multiproc
def test_the_script_runs_the_strategy_the_launcher_names(tmp_path):
    chosen = _launch(tmp_path / "fsdp", "--strategy", "fsdp", "--precision", "bf16-mixed")
    assert chosen.returncode == 0, chosen.stderr[-3000:]
    assert [
        (r["strategy"], r["precision"], r["world_size"], r["wrapper"])
        for r in _ranks(tmp_path / "fsdp")
    ] == [("fsdp", "bf16-mixed", 2, "FSDPLinear")] * 2
    # no --strategy: ddp, with its options
    default = _launch(tmp_path / "ddp", "--set", "ddp.bucket_cap_mb=7")
    assert default.returncode == 0, default.stderr[-3000:]
    for rank in _ranks(tmp_path / "ddp"):
        assert (rank["strategy"], rank["precision"], rank["wrapper"]) == (
            "ddp",
            "32-true",
            "DistributedDataParallel",
        )
        assert rank["options"]["bucket_cap_mb"] == 7


@pytest.mark.multiproc
def test_a_script_that_contradicts_the_launcher_is_refused_naming_both(tmp_path):
    proc = _launch(tmp_path, "--strategy", "fsdp", script_args=("ddp",))
    assert proc.returncode == 1
    assert "the script asks for strategy 'ddp', the launcher for 'fsdp'" in proc.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--strategy", "horovod"], "starts its processes with horovodrun"),
        (["--strategy", "ddp-spawn"], "use --strategy ddp"),
        (["--strategy", "single"], "runs in one process, but the job has 2 processes"),
        (
            ["--strategy", "ddp", "--set", "deepspeed.zero_stage=3"],
            "no 'deepspeed' section; its options are the 'ddp'",
        ),
        (
            ["--strategy", "deepspeed-zero3", "--set", "deepspeed.zero_stage=2"],
            "sets deepspeed.zero_stage=3",
        ),
        (["--strategy", "ddp", "--set", "ddp.bucket_cap_mb=-1"], "bucket_cap_mb"),
        (["--strategy", "ddp", "--set", "ddp.bucket_cap"], "--set expects section.key=value"),
    ],
)
def test_a_bad_choice_fails_before_any_process_starts(flags, message, capsys, monkeypatch):
    monkeypatch.setattr(
        "rankwise.cli.launch.launch_command_line", lambda *a: pytest.fail("processes were started")
    )
    assert cli.main(["launch", "--nproc-per-node", "2", *flags, "script.py"]) == 2
    assert message in capsys.readouterr().err


def test_the_launcher_hands_its_choice_to_the_workers_and_clears_a_stale_one(monkeypatch):
    seen = {}
    monkeypatch.setenv(STRATEGY, "stale")
    monkeypatch.setattr(
        "rankwise.cli.launch.launch_command_line",
        lambda argv, parser: seen.update(
            {k: __import__("os").environ.get(k) for k in (STRATEGY, PRECISION, OPTIONS)}
        ),
    )
    assert (
        cli.main(
            [
                "launch",
                "--nproc-per-node",
                "2",
                "--strategy",
                "deepspeed",
                "--set",
                # the script's own flag
                "deepspeed.offload_optimizer=true",
                "x.py",
                "--strategy",
                "mine",
            ]
        )
        == 0
    )
    assert seen == {
        STRATEGY: "deepspeed",
        PRECISION: None,
        OPTIONS: json.dumps({"offload_optimizer": True}),
    }
    assert cli.main(["launch", "--nproc-per-node", "2", "x.py"]) == 0
    assert seen == {STRATEGY: None, PRECISION: None, OPTIONS: None}


def test_settle_prefers_the_script_then_the_launcher_then_the_job_size():
    launched = Choice("fsdp", "bf16-mixed", {}).environment()
    assert settle(None, None, None, 2, launched) == ("fsdp", "bf16-mixed", None)
    # agreeing is fine
    assert settle("fsdp", None, None, 2, launched) == ("fsdp", "bf16-mixed", None)
    assert settle(None, None, None, 2, {}) == ("ddp", "32-true", None)
    assert settle(None, None, None, 1, {}) == ("single", "32-true", None)
    assert settle("deepspeed", "16-mixed", {"zero_stage": 1}, 1, {}) == (
        "deepspeed",
        "16-mixed",
        {"zero_stage": 1},
    )
    with pytest.raises(ConfigError, match="precision '32-true', the launcher for 'bf16-mixed'"):
        settle(None, "32-true", None, 2, launched)


def test_settle_merges_the_launchers_options_with_the_scripts():
    launched = Choice("deepspeed", None, {"zero_stage": 3}).environment()
    assert settle(None, None, {"bucket_size": 7}, 2, launched) == (
        "deepspeed",
        "32-true",
        {"zero_stage": 3, "bucket_size": 7},
    )
    with pytest.raises(ConfigError, match="sets option zero_stage=1, the launcher zero_stage=3"):
        settle(None, None, {"zero_stage": 1}, 2, launched)


def test_without_a_strategy_the_job_size_decides_and_precision_alone_does_not_choose_one(
    monkeypatch, capsys
):
    seen = {}
    monkeypatch.setattr(
        "rankwise.cli.launch.launch_command_line",
        lambda argv, parser: seen.update(
            {k: __import__("os").environ.get(k) for k in (STRATEGY, PRECISION)}
        ),
    )
    assert cli.main(["launch", "--nproc-per-node", "1", "--precision", "bf16-mixed", "x.py"]) == 0
    assert seen == {STRATEGY: None, PRECISION: "bf16-mixed"}  # one process: the script gets single
    assert (
        cli.main(["launch", "--nproc-per-node", "1", "--set", "ddp.bucket_cap_mb=5", "x.py"]) == 2
    )
    assert (
        "strategy 'single' reads no 'ddp' section; it takes no options" in capsys.readouterr().err
    )
