"""Whether a row's profiled steps explain its timed window (unit): a slow sample now and then is
named as its rank's data wait over the window; a profile that differs from the window by more than
the noise cannot explain the row, and the line says so with both numbers."""

from rankwise.measure.breakdown import PARTS
from rankwise.tools.bench.why import cells, detail, explain


def rank(r, step, late=0.0, last_in=0, **parts):
    values = {part: parts.get(part, 0.0) for part in PARTS}
    values["forward"] = step - sum(v for k, v in values.items() if k != "forward")
    return {
        "rank": r,
        "step_ms": step,
        "parts_ms": values,
        "late_ms": late,
        "sync_ms": {},
        "loader": "_SingleProcessDataLoaderIter",
        "steps": 5,
        "steps_kept": 5,
        "last_in": last_in,
    }


def timed(r, step, data, slow=0, longest=None, slow_ms=None):
    return {
        "rank": r,
        "step_ms": step,
        "data_ms": data,
        "data_max_ms": longest if longest is not None else data,
        "slow_batches": slow,
        "slow_ms": slow_ms if slow_ms is not None else (data if slow else 0.0),
    }


def issue_51_profile(**window):
    """What the issue measured: five profiled steps of 17.5 and 19.3 ms blaming exposed
    communication, beside a timed window of 46.4 ms a step."""
    return {
        "ranks": [rank(0, 17.5, comm=8.0), rank(1, 19.3, comm=8.5)],
        "steps": [4, 8],
        "window_step_ms": 46.4,
        **window,
    }


def test_a_profile_far_from_the_window_cannot_explain_the_row_and_gives_both_numbers():
    why = explain(issue_51_profile())
    assert why is not None and why["part"] == "unexplained" and why["rank"] is None
    assert why["line"].startswith("cannot explain this row")
    assert "19.3 ms a step" in why["line"] and "46.4 ms" in why["line"] and "-58%" in why["line"]
    assert "-25% to +200%" in why["line"]
    assert "communication" not in why["line"]  # not the profile's exposed comm


def test_a_slow_sample_now_and_then_is_named_as_its_ranks_data_wait_over_the_window():
    # 40 ms in one sample of 32 on rank 1: 12 of its 40 timed steps slow, none of the profiled ones
    window = {
        "steps": 40,
        "paused": 0,
        "step_ms": 46.4,
        "ranks": [timed(0, 46.3, 0.3), timed(1, 46.4, 28.9, slow=12, longest=121.0)],
    }
    why = explain(issue_51_profile(window=window))
    assert why is not None and why["part"] == "data" and why["rank"] == 1
    assert why["line"].startswith("rank 1 waits 28.9 ms a step for its next batch")
    assert "12 of them over half a step, up to 121.0 ms" in why["line"]
    assert "its profiled steps showed 0.0 ms" in why["line"] and "num_workers=2" in why["line"]
    # the table's data cell is the window's, and --explain shows every rank's window
    assert cells(issue_51_profile(window=window))["data_ms"] == 28.9
    text = detail("torch x2", issue_51_profile(window=window))
    assert "the timed window, every step (40 steps):" in text
    assert "rank 1: 46.4 ms a step, 28.90 ms of it waiting for data" in text


def test_a_data_wait_in_every_batch_that_the_profile_saw_is_left_to_the_profile():
    # Rank 1 waits 30 ms for every batch; the profiled steps saw it: rank 0 waits for rank 1.
    breakdown = {
        "ranks": [rank(0, 40, straggler=30, last_in=0), rank(1, 40, data=31, late=30, last_in=5)],
        "steps": [4, 8],
        "window_step_ms": 41.0,
        "window": {
            "steps": 30,
            "paused": 0,
            "step_ms": 41.0,
            "ranks": [timed(0, 41.0, 0.3), timed(1, 41.0, 30.5, slow=30, longest=33.0)],
        },
    }
    why = explain(breakdown)
    assert why is not None and why["part"] == "straggler" and "for rank 1" in why["line"]


def test_a_window_within_the_noise_of_the_profile_keeps_the_profiles_cause():
    # (the profiler's own cost makes a profiled step somewhat longer than the window's)
    for window_ms in (22.0, 6.0):
        breakdown = {"ranks": [rank(0, 17.5, comm=8.0), rank(1, 17.5, comm=8.5)]}
        why = explain({**breakdown, "window_step_ms": window_ms})
        assert why is not None and why["part"] == "comm", (window_ms, why)


def test_a_profile_much_slower_than_the_window_is_the_profilers_cost_and_cannot_explain_it():
    why = explain({"ranks": [rank(0, 48.0, comm=8.0)], "window_step_ms": 15.0})
    assert why is not None and why["part"] == "unexplained"
    assert "48.0 ms a step" in why["line"] and "15.0 ms" in why["line"] and "+220%" in why["line"]


def test_a_few_slow_batches_that_are_not_most_of_the_wait_are_left_to_the_profile():
    # a millisecond step: a steady 0.2 ms data wait a step, and 24 batches of 2030 the machine
    # slowed to 3 ms: not a slow sample now and then
    breakdown = {
        "ranks": [rank(0, 1.1, data=0.2)],
        "window": {
            "steps": 2030,
            "paused": 0,
            "step_ms": 1.06,
            "ranks": [timed(0, 1.06, 0.18, slow=24, longest=3.0, slow_ms=0.035)],
        },
    }
    why = explain(breakdown)
    # (the profile's own line: its 0.2 ms of 1.1)
    assert why is not None and "over the timed window" not in why["line"], why
    assert why["line"].startswith("rank 0 waits 0.2 ms a step for its next batch ("), why
