"""`rankwise bench --script`: a user's script, unchanged, under each strategy; real runs, honest
verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import ROOT
from tests.support.strategies import strategies_for
from tests.support.tools.verify import loader_line


def _bench(
    out: Path, script: str, strategies: str, *script_args: str
) -> subprocess.CompletedProcess:
    path = ROOT / script if "/" in script else ROOT / "examples" / script
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rankwise.cli",
            "bench",
            "--script",
            str(path),
            "--strategies",
            strategies,
            "--steps",
            "4",
            "--min-window",
            "0",
            "--out",
            str(out),
            "--json",
            "--",
            *script_args,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=out.parent,
    )


# every strategy `rankwise launch` starts (tests/support/strategies.py)
STRATEGIES = strategies_for("scripts")


# 16 launches of GPT-2 (6 throughput rows, 5 verify pairs): 144 s alone, 252 s beside another
# pytest-xdist worker
@pytest.mark.multiproc
@pytest.mark.timeout(900)
def test_a_stock_language_model_passes_every_rows_equivalence_and_the_row_says_how_it_was_compared(
    tmp_path,
):
    """The GPT-2 example at library defaults (AdamW eps 1e-8, dropout 0.1, accumulation 2, clipping,
    warm-up + cosine): before the lockstep criterion every distributed row FAILed (7.7e-2 with
    dropout on, 2e-5 without)."""
    out = tmp_path / "lm"
    proc = _bench(
        out, "causal_lm.py", ",".join(STRATEGIES), "--samples", "256", "--batch-size", "16"
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line["row"]: line for line in json.loads(proc.stdout.strip().splitlines()[-1])["rows"]}
    assert list(rows) == ["single", *STRATEGIES]
    assert rows["single"]["verdict"] == "reference"
    for name, line in rows.items():
        assert line["status"] == "ok", (name, line["status"])
        assert line["processes"] == (1 if name == "single" else 2)
        assert (
            line["samples_per_s"] > 0
            and line["speedup"] > 0
            and len(line["peak_rss_mb"]) == line["processes"]
        )
        if name != "single":
            assert line["verdict"] == "equivalent" and line["equivalent"] is True, (name, line)
            assert line["compared"] == "dropout off (7 modules)" and line["compared_steps"] == 5
            assert line["max_gradient_diff"] < line["gradient_tolerance"], (name, line)
    saved = json.loads((out / "report.json").read_text())
    assert [line["row"] for line in saved["rows"]] == list(rows)
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert (
        "| fsdp | 2 |" in report
        and "throughput: the script as written; equivalence: `rankwise verify`" in report
    )
    # each row's own verify report, for the details
    assert (out / "verify" / "fsdp" / "verify.json").exists()


@pytest.mark.multiproc
def test_batch_norm_under_ddp_is_not_equivalent_and_the_row_says_why(tmp_path):
    proc = _bench(tmp_path / "cnn", "image_cnn.py", "ddp", "--samples", "128", "--batch-norm")
    assert proc.returncode == 1  # a non-equivalent row fails the bench, never passes
    ddp = json.loads(proc.stdout.strip().splitlines()[-1])["rows"][1]
    assert ddp["verdict"] == "not equivalent" and ddp["equivalent"] is False
    assert ddp["max_gradient_diff"] > ddp["gradient_tolerance"]
    assert "BatchNorm2d" in ddp["reason"] and "SyncBatchNorm" in ddp["reason"]
    assert "ddp: the model has BatchNorm2d" in proc.stdout


@pytest.mark.multiproc
def test_a_plain_data_loader_is_counted_from_what_reached_the_model_and_never_passes(tmp_path):
    """Each rank iterates every sample: before, the row read "None samples/s", 0 samples/s and
    `pass`."""
    proc = _bench(
        tmp_path / "plain", "tests/support/tools/verify_cases.py", "ddp", "--case", "plain-loader"
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    single, ddp = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    # counted from the batches a backward consumed
    assert single["samples_per_s"] > 0 and ddp["samples_per_s"] > 0
    assert (
        ddp["verdict"] == "not equivalent"
        and "each of the 2 ranks saw the same 16 samples" in ddp["reason"]
    )
    log = (tmp_path / "plain" / "runs" / "ddp-0" / "bench.log").read_text()
    # the Runtime's warning
    assert log.count("all 2 ranks trained on the same 16 samples in the first step") == 1


def test_random_ops_that_cannot_be_switched_off_make_a_row_not_comparable_neither_pass_nor_fail():
    from rankwise.tools.bench.script_report import table
    from rankwise.tools.bench.user_script import ScriptRow, summarize

    run = {
        "steady_samples_per_s": 10.0,
        "wall_s": 1.0,
        "precision": "32-true",
        "peak_rss_mb": [1.0],
        "cuda_max_allocated_mb": [None],
        "samples_counted_by": "DataLoader",
    }
    report = {
        "verdict": "not comparable",
        "step_lines": [
            {"step": 0, "max_param_diff": 0.0},
            {"step": 1, "max_param_diff": 0.0, "gradient_diff": 0.4},
        ],
        "dropout": {"modules": []},
        "diagnosis": ["the forward drew random numbers (dropout in Net)"],
        "failure": {},
        "tolerance": 1e-5,
        "gradient_tolerance": 5e-5,
    }
    summary = summarize(
        [ScriptRow("single", 1), ScriptRow("ddp", 2)],
        {"single": [run], "ddp": [run | {"peak_rss_mb": [1.0, 1.0]}]},
        {"ddp": report},
    )
    ddp = summary["rows"][1]
    assert ddp["verdict"] == "not comparable" and ddp["equivalent"] is None
    assert "| not comparable |" in table(summary) and "FAIL" not in table(summary)
    assert "dropout in Net" in ddp["reason"]


def test_a_row_whose_rank_hung_at_exit_keeps_its_numbers_and_says_so_under_the_table():
    from rankwise.tools.bench.script_report import table
    from rankwise.tools.bench.user_script import ScriptRow, summarize

    run = {
        "steady_samples_per_s": 10.0,
        "wall_s": 1.0,
        "precision": "32-true",
        "peak_rss_mb": [1.0, 1.0],
        "cuda_max_allocated_mb": [None],
        "samples_counted_by": "DataLoader",
    }
    hung = (
        "rank 1 (host h, local rank 1, pid 7) finished its work, hung at exit (after the script "
        "returned), ended"
    )
    summary = summarize([ScriptRow("ddp", 2)], {"ddp": [run, run | {"hung_at_exit": [hung]}]}, {})
    row = summary["rows"][0]
    assert row["status"] == "ok" and row["samples_per_s"] == 10.0
    assert f"- ddp: a run's {hung}" in table(summary)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--script", "missing.py"], f"--script {Path.cwd() / 'missing.py'}: no such file"),
        (
            ["--script", "examples/causal_lm.py", "--strategies", "horovod"],
            "not started by `rankwise launch`",
        ),
        (["--script", "examples/causal_lm.py", "--steps", "1"], "--steps must be at least 2"),
        (
            ["--script", "examples/causal_lm.py", "--verify-steps", "0"],
            "--verify-steps must be at least 1",
        ),
        (
            ["--script", "examples/causal_lm.py", "--min-window", "-1"],
            "--min-window must be 0 or more seconds",
        ),
        (["extra"], "only --script takes arguments"),
    ],
)
def test_bad_script_flags_fail_before_anything_runs(argv, message, capsys, monkeypatch):
    from rankwise import cli

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(
        "rankwise.tools.bench.user_script.run_bench", lambda *a, **k: pytest.fail("something ran")
    )
    assert cli.main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.multiproc
def test_a_row_that_crashed_could_not_run_exit_4_with_its_error_once_under_the_table(tmp_path):
    proc = _bench(
        tmp_path / "crash",
        "tests/support/tools/verify_cases.py",
        "single,ddp",
        "--batch-size",
        "15",
        "--grad-accum",
        "1",
    )  # 15 does not split over 2 ranks: ddp crashes, single runs
    output = proc.stdout + proc.stderr
    assert proc.returncode == 4, output[-3000:]
    # what a reader sees (--json's line aside)
    shown = "\n".join(proc.stdout.splitlines()[:-1]) + proc.stderr
    assert shown.count("batch_size=15 is not divisible by world_size (2)") == 1, output
    assert "| ddp | 2 | | | | | | | | | could not run |" in proc.stdout
    assert (
        "bench [2/2] ddp (repeat 1/1):" in proc.stderr
        and "could not run (why: under the table)" in proc.stderr
    )
    rows = {line["row"]: line for line in json.loads(proc.stdout.strip().splitlines()[-1])["rows"]}
    assert rows["ddp"]["status"] == "could not run"
    assert f"verify_cases.py, line {loader_line()}" in rows["ddp"]["reason"]


@pytest.mark.multiproc
def test_a_fast_script_is_timed_over_a_window_of_seconds_with_the_spread_over_repeats(tmp_path):
    path = ROOT / "tests" / "support" / "tools" / "bench" / "fast_loop.py"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankwise.cli",
            "bench",
            "--script",
            str(path),
            "--strategies",
            "ddp",
            "--steps",
            "10",
            "--repeats",
            "2",
            "--verify-steps",
            "2",
            "--out",
            str(tmp_path / "fast"),
            "--json",
            "--explain",
            "ddp",
            "--",
            "--epochs",
            "40",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stdout)
    rows = {line["row"]: line for line in json.loads(proc.stdout.strip().splitlines()[-1])["rows"]}
    # each repeat's measurement
    runs = json.loads((tmp_path / "fast" / "report.json").read_text())["runs"]
    for name in ("single", "ddp"):
        row = rows[name]
        # 10 steps of about a millisecond would be a 10 ms window (8 timed after 2 of warm-up); the
        # bench ran on until it lasted 2 s.  (How many steps that takes depends on the load: 76 for
        # `single` beside another xdist worker.)
        assert row["window_s"] >= 2.0 and row["timed_steps"] > 10 and not row["window_short"], row
        # The spread is the repeats' own: (fastest - slowest) / median of the two runs' samples/s.
        # (How large it is says how busy the machine was: beside another test it reached 150 %.)
        speeds = sorted(run["steady_samples_per_s"] for run in runs[name])
        assert len(speeds) == 2 and row["samples_per_s"] == pytest.approx(
            sum(speeds) / 2, abs=0.01
        ), row
        assert row["spread"] == pytest.approx(
            (speeds[1] - speeds[0]) / row["samples_per_s"], abs=1e-4
        ), row
    assert "throughput window per run (median): single " in proc.stdout and " ±" in proc.stdout
    # Each row's step, broken down (steps profiled between the warm-up and the window), with its
    # cause; --explain shows every rank of one row, the same from the report afterwards.
    for name, ranks in (("single", 1), ("ddp", 2)):
        breakdown = rows[name]["breakdown"]
        assert breakdown["steps"] == [3, 7] and len(breakdown["ranks"]) == ranks, breakdown
        for rank in breakdown["ranks"]:
            assert rank["parts_ms"]["forward"] > 0 and rank["parts_ms"]["backward"] > 0, rank
        assert rows[name]["why"]["line"] and f"- {name}: why: " in proc.stdout
    assert "step ms: compute · comm · data · sync · wait" in proc.stdout
    explained = proc.stdout.split("wrote ", 1)[1]
    assert (
        "ddp: steps 3-7 profiled" in explained
        and "rank 1:" in explained
        and "waiting for slowest rank" in explained
    )
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankwise.cli",
            "bench",
            "--explain",
            "ddp",
            "--report",
            str(tmp_path / "fast" / "report.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0 and again.stdout.strip() in explained, again.stdout + again.stderr


@pytest.mark.multiproc
def test_steps_past_the_scripts_length_say_how_many_it_ran(tmp_path):
    path = ROOT / "tests" / "support" / "tools" / "bench" / "fast_loop.py"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankwise.cli",
            "bench",
            "--script",
            str(path),
            "--strategies",
            "ddp",
            "--steps",
            "50",
            "--out",
            str(tmp_path / "short"),
            "--",
            "--epochs",
            "1",
            "--samples",
            "320",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 4, output[-3000:]
    assert "the script ended after 10 optimizer steps, before the 50 asked" in output, output[
        -3000:
    ]


@pytest.mark.multiproc
def test_a_script_shorter_than_the_window_runs_again_and_its_windows_are_pooled(tmp_path):
    path = ROOT / "tests" / "support" / "tools" / "bench" / "fast_loop.py"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankwise.cli",
            "bench",
            "--script",
            str(path),
            "--strategies",
            "ddp",
            "--steps",
            "10",
            "--verify-steps",
            "2",
            "--out",
            str(tmp_path / "pooled"),
            "--json",
            "--",
            "--epochs",
            "1",
            "--samples",
            "1024",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line["row"]: line for line in json.loads(proc.stdout.strip().splitlines()[-1])["rows"]}
    ddp = rows["ddp"]
    assert ddp["script_ended"] and ddp["pooled_runs"] > 1, ddp  # 32 steps a run: far from 2 s
    assert ddp["timed_steps"] > 32 and ddp["samples_per_s"] > 0, ddp
    # The script's `with rankwise.setup()` closed its group before the window's end: every rank's
    # peak memory still.
    assert len(ddp["peak_rss_mb"]) == 2 and all(ddp["peak_rss_mb"]), ddp
    assert "runs of the script pooled" in proc.stdout
    assert (ddp["window_s"] >= 2.0) != ("ddp: the script ended before a 2 s window" in proc.stdout)


@pytest.mark.parametrize(
    ("verdicts", "code"),
    [
        (["reference", "equivalent"], 0),
        # Before, a vacuous row exited 0 where verify exits 5 on the same script
        (["reference", "vacuous"], 5),
        (["reference", "not comparable"], 3),
        (["reference", "could not run"], 4),
        (["reference", "vacuous", "not equivalent"], 1),
        (["reference", "not comparable", "vacuous"], 5),
    ],
)
def test_bench_exits_as_verify_does_for_its_gravest_row(verdicts, code):
    from rankwise.tools.bench.user_script import exit_code

    rows = [
        {"row": f"row {i}", "status": "ok", "samples_per_s": 10.0, "verdict": verdict}
        for i, verdict in enumerate(verdicts)
    ]
    assert exit_code(rows) == code


def test_a_row_without_a_figure_never_passes_and_a_not_comparable_one_stays_so():
    """nanoGPT makes its own batches, so no row has samples/s: bench exited 1 where verify exits 3
    (not comparable); a row that would pass without a figure still fails."""
    from rankwise.tools.bench.user_script import exit_code

    def rows(verdict):
        return [
            {"row": "x1", "status": "ok", "samples_per_s": None, "verdict": "reference"},
            {"row": "x2", "status": "ok", "samples_per_s": None, "verdict": verdict},
        ]

    assert exit_code(rows("not comparable")) == 3
    assert exit_code(rows("equivalent")) == 1


def test_a_row_failed_by_a_finding_says_so_in_the_progress_line_the_table_and_the_exit_code():
    """A Lightning bench printed "equivalent" in its progress line and FAIL in its table."""
    from rankwise.tools.bench.equivalence import lockstep_columns
    from rankwise.tools.verify.command import exit_code as verify_exit

    report = {
        "verdict": "equivalent",
        "step_lines": [{"step": 1, "max_param_diff": 0.0, "gradient_diff": 0.0, "data": "same"}],
        "dropout": {"modules": []},
        "diagnosis": [],
        "failure": {},
        "tolerance": 1e-5,
        "gradient_tolerance": 5e-5,
        "findings": [{"level": "error", "kind": "counted-more", "text": "counted twice"}],
    }
    columns = lockstep_columns(report)
    assert columns["verdict"] == "not equivalent" and verify_exit(report) == 1
    assert columns["reason"] == "counted twice"
    failed_after = report | {
        "findings": [{"level": "failed", "kind": "failed-after", "text": "it crashed later"}]
    }
    columns = lockstep_columns(failed_after)
    assert columns["verdict"] == "could not run" and verify_exit(failed_after) == 4
    assert "it crashed later" in columns["reason"]
