"""A bench row whose figure cannot be true is marked disturbed, with the evidence, and no slower
row is named fastest in its place."""

from __future__ import annotations

from rankwise.tools.bench import disturbed
from rankwise.tools.bench.script_report import table
from rankwise.tools.bench.user_script import ScriptRow, summarize


def _run(samples_per_s: float, peaks: list[float], load: float = 0.4) -> dict:
    return {
        "steady_samples_per_s": samples_per_s,
        "wall_s": 5.0,
        "precision": "32-true",
        "device": "cpu",
        "peak_rss_mb": [900.0] * len(peaks),
        "cuda_max_allocated_mb": [None] * len(peaks),
        "samples_counted_by": "DataLoader",
        "peak_flops_per_s_by_rank": peaks,
        "load_average": load,
    }


def _verdict() -> dict:
    return {
        "verdict": "equivalent",
        "step_lines": [{"step": 1, "max_param_diff": 0.0, "gradient_diff": 0.0}],
        "dropout": {"modules": []},
        "diagnosis": [],
        "failure": {},
        "tolerance": 1e-5,
        "gradient_tolerance": 5e-5,
    }


def test_a_reference_slowed_by_another_job_marks_both_rows_and_neither_is_the_fastest(monkeypatch):
    """The new user's bench on 2 cores: 7.05x for 2 processes, the one-process row's measured peak
    17-65 GFLOP/s against 134-151 in the other row, and the machine loaded."""
    monkeypatch.setattr(disturbed, "usable_cores", lambda: 2)
    rows = [ScriptRow("single", 1), ScriptRow("ddp", 2)]
    runs = {
        "single": [_run(100.0, [17e9], load=3.1), _run(100.0, [65e9], load=3.1)],
        # (one core each: 134-151 on two)
        "ddp": [_run(705.0, [67e9, 75e9]), _run(705.0, [70e9, 74e9])],
    }
    summary = summarize(rows, runs, {"ddp": _verdict()})
    single, ddp = summary["rows"]
    said = (
        "its ranks measured a matrix-product peak of 8-32 GFLOP/s per core against 75 in another "
        "row"
    )
    assert said in single["disturbed"]
    assert "load average 3.1 on 2 cores" in single["disturbed"]
    assert ddp["disturbed"].startswith(
        "7.05x is more than 2 process(es) on 2 core(s) can give against 1 on 2"
    )
    assert summary["fastest"] is None
    shown = table(summary)
    assert "(disturbed)" in shown and "rerun the bench on a quiet machine" in shown


def test_a_quiet_bench_marks_nothing_and_a_wide_spread_alone_is_enough(monkeypatch):
    monkeypatch.setattr(disturbed, "usable_cores", lambda: 2)
    rows = [ScriptRow("single", 1), ScriptRow("ddp", 2)]
    quiet = {
        "single": [_run(100.0, [140e9]), _run(104.0, [138e9])],
        # (one core each: half the peak)
        "ddp": [_run(131.0, [70e9, 72e9]), _run(127.0, [69e9, 71e9])],
    }
    summary = summarize(rows, quiet, {"ddp": _verdict()})
    assert (
        not any(line.get("disturbed") for line in summary["rows"]) and summary["fastest"] == "ddp"
    )
    noisy = {**quiet, "ddp": [_run(90.0, [70e9, 72e9]), _run(160.0, [69e9, 71e9])]}
    summary = summarize(rows, noisy, {"ddp": _verdict()})
    assert summary["rows"][1]["disturbed"].startswith("its repeats spread ±28% (bound ±20%)")
    # Before, the one-process row, at less than the disturbed row's every run, was "fastest"
    assert summary["fastest"] is None and summary["fastest_undecided"] == ["ddp"]
    assert "fastest row: undecided, ddp passed but was disturbed" in table(summary)


def test_the_hardware_bound_counts_gpus_or_the_cores_the_threads_use(monkeypatch):
    monkeypatch.setattr(disturbed, "usable_cores", lambda: 16)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert disturbed.units(8, "cuda") == 8
    # (threads: cores / processes)
    assert disturbed.units(1, "cpu") == 16 and disturbed.units(2, "cpu") == 16
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's threads, as the launchers give them
    assert disturbed.units(1, "cpu") == 1 and disturbed.units(2, "cpu") == 2
