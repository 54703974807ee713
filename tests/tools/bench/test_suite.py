"""`rankwise bench` on a tiny slice: real runs, a report with every column, and checks that can
fail."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rankwise.tools.bench import report
from rankwise.tools.bench.equivalence import (
    criterion,
    lockstep_columns,
    verify_app,
    weights_columns,
)
from rankwise.tools.bench.rows import Row, all_rows, select
from rankwise.tools.bench.suite import plan, run_all
from tests.support.tiers import starts_processes

TINY = [
    "data.limit=1000",
    "data.tokenizer=char",
    "data.max_length=32",
    "max_steps=12",
    "eval_batch_size=64",
]
# Deliberately wrong: another learning rate (so not what `single` trains), and the dev split (886
# texts) evaluated where the bench expects the test split's 1000.  Its equivalence is the lockstep
# one: ddp under its own settings.
WRONG = Row(
    "wrong", "ddp", ("optim.lr=0.01", "eval_split=dev"), about="deliberately not what single trains"
)


@pytest.fixture(scope="module")
@starts_processes()
def summary(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    the_plan = plan(
        "quick", [*select(["single", "plain-ddp"]), WRONG], nproc=2, out=out, extra=TINY
    )
    records = run_all(the_plan, progress=False)
    meta = {
        "preset": "quick",
        "data": "sentiment",
        "model": "tiny",
        "steps": 12,
        "batch_size": 32,
        "nproc": 2,
        "repeats": 1,
        "equivalence_step": the_plan.equivalence_step,
        "libraries": {},
        "cpu": "test",
        "cores": the_plan.cores,
        "cuda": None,
        "torch": "x",
        "python": "y",
    }
    result = report.summarize(records, meta)
    return result, report.write(result, out)


def test_the_report_has_every_column_valid_json_and_a_png(summary):
    result, paths = summary
    rows = {line["row"]: line for line in result["rows"]}
    for name in ("single", "plain-ddp"):
        line = rows[name]
        assert line["status"] == "ok"
        for key in (
            "wall_s",
            "samples_per_s",
            "tokens_per_s",
            "speedup",
            "peak_rss_mb",
            "accuracy",
            "macro_f1",
            "eval_samples",
        ):
            assert line[key] is not None, (name, key)
        assert line["eval_count_ok"] and line["equivalent"] and line["accuracy_ok"]
        assert len(line["peak_rss_mb"]) == line["processes"]
    assert rows["single"]["speedup"] == 1.0
    assert rows["single"]["criterion"] == "reference" and rows["single"]["verdict"] == "reference"
    # rankwise rows count their FLOPs and measure a peak; the hand-written baseline loop does
    # neither.
    single_run = next(record for record in result["runs"] if record["row"] == "single")["runs"][0]
    assert rows["single"]["tflops_per_s"] > 0 and single_run["peak_tflops_per_s"] > 0
    # MFU: the run's FLOP/s over the matrix-product peak its ranks measured beside it.  A ratio of
    # two measurements, not a bound: with another test loading the cores while the peak was measured
    # it read 271 %.
    assert rows["single"]["mfu"] == pytest.approx(
        rows["single"]["tflops_per_s"] / single_run["peak_tflops_per_s"], rel=1e-2
    )
    assert rows["plain-ddp"]["tflops_per_s"] is None
    saved = json.loads(paths["json"].read_text())
    assert [line["row"] for line in saved["rows"]] == ["single", "plain-ddp", "wrong"]
    assert (
        paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        and paths["png"].stat().st_size > 10_000
    )
    markdown = paths["md"].read_text()
    assert (
        f"| plain-ddp | 2 × {max(1, meta_cores(result) // 2)} |" in markdown
        and "## Reading" in markdown
    )
    assert "| TFLOP/s | MFU |" in markdown and f"| {rows['single']['mfu']:.1%} |" in markdown
    # rankwise rows break their step down (the last steps, 8-12, after the timed window 6-7); the
    # baseline does not.
    for name, ranks in (("single", 1), ("wrong", 2)):
        breakdown = rows[name]["breakdown"]
        assert breakdown["steps"] == [8, 12] and len(breakdown["ranks"]) == ranks, breakdown
        (record,) = [r for r in summary[0]["runs"] if r["row"] == name]
        assert record["runs"][0]["steady_steps"] == 2  # steps 6 and 7
        assert (
            all(r["parts_ms"]["backward"] > 0 for r in breakdown["ranks"])
            and rows[name]["why"]["line"]
        )
        assert f"- {name}: why: " in markdown
    assert rows["plain-ddp"]["breakdown"] is None and "step ms: compute · comm" in markdown
    # one process
    assert rows["single"]["steps"]["comm_ms"] == 0 and rows["single"]["steps"]["straggler_ms"] == 0
    assert "| Δgradient (tol) | Δweights (tol) | equivalent | criterion |" in markdown


def test_timed_rows_run_at_the_apps_stock_settings_and_each_row_says_which_check_judged_it(summary):
    """The timed runs keep dropout on; ddp is judged by rankwise verify in lockstep (its own runs
    switch dropout off), the hand-written loop, which verify does not run, by its weights after 5
    steps in separate runs with dropout 0."""
    result, paths = summary
    rows = {line["row"]: line for line in result["rows"]}
    timed = {record["row"]: record["runs"][0]["run_dir"] for record in result["runs"]}
    stock = json.loads((Path(timed["single"]) / "config.json").read_text())
    # the app's defaults, untouched
    assert stock["model"]["dropout"] == 0.1 and stock["optim"]["eps"] == 1e-6
    wrong = rows["wrong"]
    assert (
        wrong["criterion"] == "lockstep"
        and wrong["verdict"] == "equivalent"
        and wrong["equivalent"] is True
    )
    assert wrong["compared_steps"] == 5 and wrong["compared"].startswith("dropout off (")
    assert (
        wrong["max_gradient_diff"] < wrong["gradient_tolerance"]
        and wrong["max_param_diff"] <= wrong["tolerance"]
    )
    verified = json.loads((paths["json"].parent / "verify" / "wrong" / "verify.json").read_text())
    assert (
        verified["strategy"] == "ddp"
        and verified["processes"] == 2
        and "optim.lr=0.01" in verified["meta"]["script_args"]
    )  # verify ran the app under the row's own settings
    plain = rows["plain-ddp"]
    assert plain["criterion"] == "weights" and plain["verdict"] == "equivalent"
    assert (
        plain["max_param_diff"] < plain["tolerance"]
        and "written without rankwise" in plain["criterion_note"]
    )
    weighed = json.loads(
        (paths["json"].parent / "equivalence" / "plain-ddp" / "result.json").read_text()
    )
    assert weighed["steps"] == 5
    assert (
        json.loads((paths["json"].parent / "equivalence" / "single" / "config.json").read_text())[
            "model"
        ]["dropout"]
        == 0.0
    )
    text = report.table(result)
    assert "| pass | lockstep (verify) |" in text and "| pass | weights (dropout 0) |" in text
    assert "- plain-ddp, criterion: a loop written without rankwise" in text


def meta_cores(result: dict) -> int:
    return result["meta"]["cores"]


def test_a_wrong_run_fails_the_count_check(summary):
    result, paths = summary
    wrong = next(line for line in result["rows"] if line["row"] == "wrong")
    assert wrong["status"] == "ok"
    assert wrong["eval_count_ok"] is False and wrong["eval_samples"] != wrong["eval_expected"]
    assert result["reading"]["failing"] == ["wrong"]
    assert result["reading"]["fastest_passing"] in ("single", "plain-ddp")
    assert "| wrong |" in report.table(result) and "FAIL" in report.table(result)


def _verify_report(verdict: str, **extra) -> dict:
    return {
        "verdict": verdict,
        "step_lines": [
            {"step": 0, "max_param_diff": 0.0},
            {"step": 1, "max_param_diff": 3e-4, "gradient_diff": 2.7e-4},
        ],
        "dropout": {"modules": [{"module": "bert.dropout"}]},
        "diagnosis": [],
        "findings": [],
        "tolerance": 1e-5,
        "gradient_tolerance": 5e-5,
        "failure": {},
        **extra,
    }


def _record(name: str, equivalence: dict) -> dict:
    run = {
        "steady_samples_per_s": 500.0,
        "wall_s": 3.0,
        "peak_rss_mb": [[500.0, 510.0]],
        "accuracy": 0.75,
        "macro_f1": 0.7,
        "eval_samples": 10,
    }
    return {
        "row": name,
        "about": "x",
        "processes": 1 if name == "single" else 2,
        "threads": 1,
        "tolerance": 1e-5,
        "missing": None,
        "runs": [run],
        "eval_expected": 10,
        "eval_count_ok": True,
        "equivalence": equivalence,
    }


_META = {
    "preset": "quick",
    "data": "sentiment",
    "model": "tiny",
    "steps": 8,
    "batch_size": 32,
    "nproc": 2,
    "repeats": 1,
    "equivalence_step": 5,
    "libraries": {},
    "cpu": "test",
    "cores": 2,
    "cuda": None,
    "torch": "x",
    "python": "y",
}


def test_each_criterions_verdict_reaches_the_table_the_reading_and_the_json():
    """A row verify finds not equivalent FAILs with verify's reason; a weight difference past the
    row's tolerance FAILs; a check that could not run neither passes nor fails (the bench exits 4
    for it)."""
    why = "the gradients were exchanged through DDP's fp16_compress communication hook"
    records = [
        _record("single", {"criterion": "reference", "verdict": "reference", "equivalent": True}),
        _record(
            "ddp",
            lockstep_columns(_verify_report("not equivalent", diagnosis=[why]))
            | {"criterion": "lockstep", "criterion_note": None},
        ),
        _record(
            "fsdp",
            lockstep_columns(_verify_report("could not run", failure={"candidate": "boom"}))
            | {"criterion": "lockstep", "criterion_note": None},
        ),
        _record(
            "plain-ddp",
            weights_columns(2e-3, 1e-5, 5)
            | {"criterion": "weights", "criterion_note": "a loop written without"},
        ),
        _record(
            "horovod",
            weights_columns(3e-8, 1e-5, 5) | {"criterion": "weights", "criterion_note": "h"},
        ),
    ]
    summary = report.summarize(records, _META)
    rows = {line["row"]: line for line in summary["rows"]}
    assert rows["ddp"]["verdict"] == "not equivalent" and rows["ddp"]["reason"] == why
    assert rows["ddp"]["max_gradient_diff"] == 2.7e-4 and rows["ddp"]["gradient_tolerance"] == 5e-5
    assert (
        rows["plain-ddp"]["verdict"] == "not equivalent"
        and rows["plain-ddp"]["max_param_diff"] == 2e-3
    )
    assert rows["horovod"]["verdict"] == "equivalent" and rows["horovod"]["max_param_diff"] == 3e-8
    assert rows["fsdp"]["verdict"] == "could not run" and "boom" in rows["fsdp"]["reason"]
    # (fsdp: could not run, not failed)
    assert summary["reading"]["failing"] == ["ddp", "plain-ddp"]
    assert summary["reading"]["fastest_passing"] in ("single", "horovod")
    text = report.table(summary)
    assert "| 2.7e-04 (5e-05) | 3.0e-04 (1e-05) | FAIL | lockstep (verify) |" in text
    assert "| — | 2.0e-03 (1e-05) | FAIL | weights (dropout 0) |" in text
    assert "| could not run | lockstep (verify) |" in text
    assert f"- ddp: {why}" in text and "- fsdp: its verify run could not run: boom" in text
    assert "- plain-ddp, criterion: a loop written without" in text


def test_a_row_whose_check_could_not_run_is_not_run_and_the_reading_and_exit_code_say_so():
    """make demo's report: seven rows with no equivalence verdict were read as "Every measured row
    passes" and not_run was empty.  A row whose check could not run (or could not judge, or never
    ran) is in not_run, the summary line does not claim it, and the bench exits 4."""
    records = [
        _record("single", {"criterion": "reference", "verdict": "reference", "equivalent": True}),
        _record(
            "ddp",
            lockstep_columns(_verify_report("could not run", failure={"verify": "no data"}))
            | {"criterion": "lockstep", "criterion_note": None},
        ),
        _record("fsdp", {}),  # (no check reached it)
        _record(
            "horovod",
            weights_columns(3e-8, 1e-5, 5) | {"criterion": "weights", "criterion_note": "h"},
        ),
    ]
    reading = report.summarize(records, _META)["reading"]
    assert reading["failing"] == [] and reading["not_run"] == ["ddp", "fsdp"]
    assert reading["unchecked"] == {"ddp": "could not run", "fsdp": "no check"}
    text = report.reading_text({"reading": reading, "meta": _META})
    assert "Every row" not in text and "passes its equivalence check" not in text
    assert "Not checked: ddp (equivalence could not run), fsdp (equivalence no check)" in text
    assert report.exit_code(reading) == report.EXIT_COULD_NOT_RUN
    # every row checked and passing: exit 0, and only then the line that says so
    passing = report.summarize([records[0], records[3]], _META)["reading"]
    assert passing["not_run"] == [] and report.exit_code(passing) == 0
    assert "Every row ran and passes" in report.reading_text({"reading": passing, "meta": _META})


def test_a_verify_that_fails_to_start_makes_the_rows_check_could_not_run_and_the_bench_goes_on(
    monkeypatch, tmp_path
):
    from rankwise.tools.verify import command

    def boom(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(command, "verify_runs", boom)
    columns = lockstep_columns(
        verify_app("ddp", 2, tmp_path, [], tmp_path / "verify", steps=5, timeout_s=1)
    )
    assert columns["verdict"] == "could not run" and columns["equivalent"] is None
    assert columns["reason"] == "its verify run could not run: OSError: No space left on device"


def test_every_row_has_a_criterion_verify_runs_what_torchrun_starts():
    quick = {row.name: criterion(row, 2) for row in all_rows()}
    assert quick["single"].kind == "reference"
    for name in (
        "dp",
        "ddp",
        "ddp+bf16",
        "fsdp",
        "deepspeed-zero2",
        "deepspeed-zero3",
        "accelerate",
        "ddp+compile",
    ):
        assert quick[name].kind == "lockstep" and quick[name].note is None, name
    assert quick["ddp"].strategy == "ddp" and quick["deepspeed-zero3"].strategy == "deepspeed-zero3"
    assert quick["ddp-spawn"].kind == "lockstep" and quick["ddp-spawn"].strategy == "ddp"
    assert "not spawn" in quick["ddp-spawn"].note
    assert "horovodrun" in quick["horovod"].note and quick["horovod"].kind == "weights"
    for name in ("plain-ddp", "plain-accelerate", "per-step-sync"):
        assert quick[name].kind == "weights" and "without rankwise" in quick[name].note
    for name in ("ddp+fp16-hook", "ddp+bf16-hook", "ddp+powersgd"):
        assert quick[name].kind == "weights" and "comm_hook" in quick[name].note
    for name in ("single-1t", "single+compile"):
        assert quick[name].kind == "weights" and "compare single with itself" in quick[name].note


def test_rows_cover_every_strategy_row_and_baseline_and_name_missing_libraries():
    names = [row.name for row in all_rows()]
    assert names[0] == "single" and {
        "plain-ddp",
        "plain-accelerate",
        "per-step-sync",
        "horovod",
    } <= set(names)
    assert select(["fsdp"])[0].name == "single"  # the reference is always run
    with pytest.raises(ValueError, match="unknown bench row"):
        select(["fsdb"])
    assert Row("x", "ddp", ("ddp.comm_hook=powersgd",)).tolerance == 1e-2
    assert "single-1t" not in [row.name for row in select(None)]  # opt-in rows run only when named
    quick, full = (
        [row.name for row in select(None, "quick")],
        [row.name for row in select(None, "full")],
    )
    assert set(full) - set(quick) == {
        "ddp+fp16-hook",
        "deepspeed-zero1",
        "deepspeed-zero3",
        "plain-accelerate",
        "per-step-sync",
        "ddp+compile",
        "fsdp+compile",
    }
    # make demo: every strategy and launcher once, and the overhead baseline
    assert {
        "single",
        "dp",
        "ddp",
        "ddp-spawn",
        "ddp+bf16",
        "fsdp",
        "deepspeed-zero2",
        "accelerate",
        "horovod",
        "plain-ddp",
    } == set(quick)
    # named: runs
    assert "deepspeed-zero3" in [row.name for row in select(["deepspeed-zero3"], "quick")]
    # in the table's order: the least sharded first, each strategy's own rows after it
    assert [row.name for row in select(["single-1t", "ddp+bf16-hook"])] == [
        "single",
        "single-1t",
        "ddp+bf16-hook",
    ]


def test_a_row_whose_library_is_missing_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "accelerate" else real(name, *a),
    )
    assert "pip install 'rankwise[accelerate]'" in select(["plain-accelerate"])[1].missing()
    assert (
        "accelerate" in select(["accelerate"])[1].missing()
        and "pip install" in select(["accelerate"])[1].missing()
    )
    assert select(["ddp"])[1].missing() is None


@pytest.mark.multiproc
def test_bad_flags_fail_before_anything_runs(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankwise.cli",
            "bench",
            "--strategies",
            "ddp,fsdb",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "unknown bench row(s) fsdb" in proc.stderr
    assert not any(tmp_path.iterdir())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankwise.cli",
            "bench",
            "--strategies",
            "ddp",
            "--explain",
            "fsdp",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        proc.returncode == 2 and "--explain fsdp: no such row (rows: single, ddp)" in proc.stderr
    ), proc.stderr
    assert not any(tmp_path.iterdir())


def test_scaling_efficiency_is_against_one_thread_per_process():
    lines = [
        {"row": "single", "processes": 1, "threads": 2, "samples_per_s": 600.0},
        {"row": "single-1t", "processes": 1, "threads": 1, "samples_per_s": 400.0},
        {"row": "ddp", "processes": 2, "threads": 1, "samples_per_s": 500.0},
    ]
    assert report.scaling_efficiency(lines) == {"ddp": 0.625}
    # no one-thread run, no efficiency
    assert report.scaling_efficiency(lines[:1] + lines[2:]) == {}


def test_scaling_efficiency_counts_every_core_a_row_used():
    """On 16 cores, 2 ranks run 8 threads each: 16 cores' worth of single-1t, not 2 (measured on the
    GPU machine: ddp 850 samples/s, single-1t 670 was reported as 0.63)."""
    lines = [
        {"row": "single-1t", "processes": 1, "threads": 1, "samples_per_s": 670.0},
        {"row": "ddp", "processes": 2, "threads": 8, "samples_per_s": 850.0},
    ]
    assert report.scaling_efficiency(lines) == {"ddp": round(850 / (16 * 670), 3)}


def test_a_log_gets_one_progress_line_per_run_not_per_update(tmp_path, monkeypatch, capsys):
    """Not a terminal (CI, `make demo > log`): one line per finished run, with its time and
    outcome."""
    from types import SimpleNamespace

    from rankwise.tools.bench import suite

    monkeypatch.setattr(
        "rankwise.data.prepare.prepare_data", lambda cfg: SimpleNamespace(size=lambda split: 10)
    )
    monkeypatch.setattr("rankwise.data.prepare.cache_entry", lambda cfg: tmp_path)
    runs = iter(
        [{"steady_samples_per_s": 500.0, "wall_s": 3.0}, {"error": "boom", "wall_s": 1.0}] * 2
    )
    monkeypatch.setattr(suite, "_run_row", lambda *args: next(runs))
    monkeypatch.setattr(suite, "check_equivalence", lambda *args: {})  # no run wrote weights here
    the_plan = plan("quick", select(["single", "ddp"]), nproc=2, out=tmp_path, repeats=2)
    run_all(the_plan, progress=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "bench [1/4] single (repeat 1/2): 3.0 s, 500.0 samples/s",
        "bench [2/4] ddp (repeat 1/2): 1.0 s, could not run (why: under the table)",
        "bench [3/4] ddp (repeat 2/2): 3.0 s, 500.0 samples/s",
        "bench [4/4] single (repeat 2/2): 1.0 s, could not run (why: under the table)",
    ]


def test_a_ratio_from_one_pair_says_so():
    def summary(pairs):
        reading = {
            "fastest_passing": None,
            "ddp_vs_plain_ddp": {"median": pairs[0], "pairs": pairs},
            "ddp_vs_plain_accelerate": None,
            "plain_ddp_vs_per_step_sync": None,
            "failing": [],
            "not_run": [],
        }
        return {"reading": reading, "meta": {"cores": 2}}

    assert "from one pair only" in report.reading_text(summary([1.05]))
    assert "median of 3 alternating pair(s): 1.0, 1.05, 0.98" in report.reading_text(
        summary([1.0, 1.05, 0.98])
    )


def test_a_row_that_could_not_run_shows_its_error_once_under_the_table():
    error = (
        "rank 0 (host vm, local rank 0, pid 1) failed first, with exit code 1: ConfigError: boom"
    )
    records = [
        {
            "row": "ddp",
            "about": "x",
            "processes": 2,
            "threads": 1,
            "tolerance": 1e-5,
            "missing": None,
            "runs": [{"error": error, "wall_s": 1.0}],
        }
    ]
    meta = {
        "preset": "quick",
        "data": "sentiment",
        "model": "tiny",
        "steps": 12,
        "batch_size": 32,
        "nproc": 2,
        "repeats": 1,
        "equivalence_step": 5,
        "libraries": {},
        "cpu": "test",
        "cores": 2,
        "cuda": None,
        "torch": "x",
        "python": "y",
    }
    summary = report.summarize(records, meta)
    text = report.table(summary)
    assert summary["rows"][0]["status"] == "could not run" and "| could not run |" in text
    assert text.count("ConfigError: boom") == 1 and f"- ddp: {error}" in text


def test_the_png_shows_a_dash_not_zero_for_a_row_without_flops_and_every_ranks_peak_memory(
    tmp_path, monkeypatch
):
    labelled = []
    label = report._bar_label
    monkeypatch.setattr(
        report, "_bar_label", lambda *args: labelled.append(label(*args)) or labelled[-1]
    )
    row = {
        "status": "ok",
        "equivalent": True,
        "eval_count_ok": True,
        "samples_per_s": 500.0,
        "speedup": 1.1,
        "accuracy": 0.8,
    }
    summary = {
        "rows": [
            {**row, "row": "single", "mfu": 0.012, "peak_rss_mb": [900.0]},
            {**row, "row": "horovod", "mfu": None, "peak_rss_mb": [812.0, 790.0]},
        ],
        "meta": {"preset": "quick", "data": "sentiment", "nproc": 2, "cores": 2},
    }
    report.plot(summary, tmp_path / "report.png")
    assert (tmp_path / "report.png").stat().st_size > 1000
    # (no "0.00" MFU for the uncounted row)
    assert {"1.2%", "—", "900", "812, 790"} <= set(labelled), labelled


def test_a_log_gets_one_line_per_check_naming_its_row_and_criterion(tmp_path, monkeypatch, capsys):
    """After the timed runs, the progress says which row's check runs, and which check."""
    from rankwise.tools.bench import suite

    monkeypatch.setattr(suite, "verify_app", lambda *args, **kwargs: _verify_report("equivalent"))
    monkeypatch.setattr(suite, "_run_row", lambda *args: {"wall_s": 2.0, "error": "no weights"})
    rows = select(["single", "ddp", "ddp-spawn", "plain-ddp"])
    the_plan = plan("quick", rows, nproc=2, out=tmp_path)
    records = {row.name: {"runs": [{"wall_s": 1.0}]} for row in rows}
    checks = suite.check_equivalence(the_plan, records, rows, tmp_path, progress=True)
    lines = [line.split(" (")[0] for line in capsys.readouterr().err.strip().splitlines()]
    assert lines == [
        "check [1/3] ddp: rankwise verify of ddp, 5 steps, dropout off: equivalent",
        "check [2/3] single: weights after 5 steps",
        "check [3/3] plain-ddp: weights after 5 steps",
    ]
    assert checks["ddp-spawn"]["verdict"] == "equivalent"  # (ddp's verify run, shared)


def test_a_rows_check_stops_its_ranks_after_the_compared_steps(summary):
    """The check compares K steps; the timed run shows the rest (evaluation, checkpoint): the N
    ranks of the check stop with the reference instead of training on (half a check's time)."""
    _, paths = summary
    candidate = Path(paths["json"]).parent / "verify" / "wrong" / "candidate"
    assert (candidate / "trace.jsonl").exists()
    assert not (candidate / "scratch" / "run" / "result.json").exists()


def test_a_row_without_a_steady_step_prints_a_dash_and_says_why():
    """A small CSV whose every epoch ends within the warm-up steps: no throughput, no crash."""
    record = _record("ddp", {"criterion": "lockstep", "verdict": "equivalent", "equivalent": True})
    record["runs"][0]["steady_samples_per_s"] = None
    summary = report.summarize([_record("single", {"verdict": "reference"}), record], _META)
    text = report.table(summary)
    assert (
        "| ddp | 2 × 1 | 3.0 | — |" in text and "- ddp: no throughput: no step was steady" in text
    )
