"""``RANKWISE_SMOKE=1`` (rankwise.cli.smoke): each command at a smoke size, read once where the
command line is read and taken out of the environment its processes inherit.  Unit tests: the
commands' runs are replaced, the settings they would get are checked."""

from __future__ import annotations

import os

import pytest

from rankwise.cli import main, smoke


@pytest.fixture
def received(monkeypatch) -> dict[str, object]:
    """What each command's run gets, instead of running it."""
    from rankwise.cli import comm, verify
    from rankwise.tools.bench import suite, user_script
    from rankwise.train import run

    seen: dict[str, object] = {}

    def keep(name):
        def run_instead(settings, *args, **kwargs):
            seen[name] = settings
            return 0

        return run_instead

    monkeypatch.setattr(run, "train", keep("train"))
    monkeypatch.setattr(suite, "bench", keep("suite"))
    monkeypatch.setattr(user_script, "bench", keep("script"))
    monkeypatch.setattr(verify.command, "run", keep("verify"))
    monkeypatch.setattr(comm.bench, "run", keep("comm"))
    return seen


@pytest.fixture
def smoke_on(monkeypatch):
    monkeypatch.setenv(smoke.VARIABLE, "1")
    yield
    smoke._on = False  # what the last main() read: no later test inherits it


def test_train_runs_at_most_the_smoke_steps_and_says_so(smoke_on, received, capsys, tmp_path):
    out = str(tmp_path / "run")
    assert main(["train", "--data", "toy", "--epochs", "3", "--out", out]) == 0
    assert received["train"].max_steps == smoke.TRAIN_STEPS
    assert "RANKWISE_SMOKE=1: at most 4 optimizer steps" in capsys.readouterr().err
    # read once, for this command: the processes it starts do not inherit it
    assert smoke.VARIABLE not in os.environ


def test_train_keeps_fewer_steps_than_the_cap(smoke_on, received, tmp_path):
    main(["train", "--data", "toy", "--max-steps", "2", "--out", str(tmp_path / "run")])
    assert received["train"].max_steps == 2


def test_without_the_variable_nothing_is_capped(received, capsys, tmp_path):
    main(["train", "--data", "toy", "--epochs", "3", "--out", str(tmp_path / "run")])
    main(["bench", "--preset", "full", "--out", str(tmp_path / "b")])
    main(["verify", "s.py", "--steps", "7"])
    assert received["train"].max_steps is None
    assert (received["suite"].preset, received["suite"].repeats) == ("full", None)
    assert received["verify"].steps == 7
    assert "RANKWISE_SMOKE" not in capsys.readouterr().err


def test_bench_runs_the_smoke_preset_once_with_the_rows_asked(smoke_on, received, tmp_path):
    main(["bench", "--preset", "full", "--strategies", "ddp,fsdp", "--out", str(tmp_path / "b")])
    settings = received["suite"]
    assert (settings.preset, settings.repeats, settings.rows) == ("smoke", 1, ("ddp", "fsdp"))


def test_bench_script_times_few_steps_and_checks_each_row_briefly(smoke_on, received, tmp_path):
    main(["bench", "--script", "s.py", "--repeats", "3", "--steps", "20", "--out", str(tmp_path)])
    settings = received["script"]
    assert (settings.steps, settings.verify_steps, settings.min_window_s, settings.repeats) == (
        smoke.SCRIPT_STEPS,
        smoke.VERIFY_STEPS,
        0.0,
        1,
    )


def test_verify_compares_the_smoke_steps(smoke_on, received):
    main(["verify", "s.py", "--strategy", "fsdp", "--steps", "5", "--", "--batch-norm"])
    settings = received["verify"]
    assert settings.steps == smoke.VERIFY_STEPS and settings.script_args == ("--batch-norm",)


def test_comm_bench_times_small_messages_few_times(smoke_on, received):
    main(["comm", "bench", "--ops", "all_reduce", "--max-bytes", "64M", "--iters", "50"])
    settings = received["comm"]
    assert settings.sizes[-1] == smoke.COMM_MAX_BYTES
    assert (settings.iters, settings.warmup) == (smoke.COMM_ITERS, 1)
