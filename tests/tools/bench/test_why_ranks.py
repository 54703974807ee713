"""The step-time breakdown on real ranks (gloo): causes injected in a plain torchrun DDP script
(tests/support/tools/bench/injected.py) are found, attributed to the right rank and part within 20 %
of the injected time, and named with their fix; a clean script has no cause above the noise."""

from pathlib import Path

import pytest

from rankwise.measure.breakdown import PARTS, PROFILED_STEPS
from rankwise.tools.bench.why import explain
from rankwise.tools.watch.frameworks import framework
from rankwise.tools.watch.runs import watched_run
from rankwise.tools.watch.settings import WatchSettings
from tests.support.tiers import starts_processes

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)

SCRIPT = Path(__file__).resolve().parents[2] / "support" / "tools" / "bench" / "injected.py"
SLEEP_MS = 30.0
SLOW_SAMPLE_MS = 40.0
CASES = {
    "clean": ["--layers", "24"],
    "slow data on rank 1": ["--slow-data-rank", "1"],
    # a slow disk: rank 1's dataset sleeps in one sample of 32, so one batch of 8 in about 4 waits
    "slow sample now and then on rank 1": [
        *("--slow-sample-rank", "1", "--slow-sample-every", "32", "--batch-size", "8"),
        *("--sleep-ms", str(SLOW_SAMPLE_MS)),
    ],
    "slow forward on rank 1": ["--slow-forward-rank", "1"],
    "barrier and item": ["--barrier", "--item"],
    "tiny buckets": ["--bucket-cap-mb", "0.01", "--layers", "24"],
}
"""The causes injected (sleeping SLEEP_MS unless a case says); the clean script and the tiny
buckets share a 24-layer model, whose 49 gradients make DDP's bucket count tell (one bucket of 1.6
MB, or dozens)."""


@pytest.fixture(scope="module")
@starts_processes()
def breakdowns(tmp_path_factory):
    """Each case once, as `rankwise bench --script` measures a row (its profiled steps before the
    window)."""
    found = {}
    for name, args in CASES.items():
        run_dir = tmp_path_factory.mktemp(name.replace(" ", "-"))
        settings = WatchSettings(
            run_dir,
            watched_steps=12,
            warmup=3,
            trace=False,
            keep_dropout=True,
            min_window_s=0.5,
            profile_steps=PROFILED_STEPS,
        )
        result = watched_run(
            SCRIPT,
            ["--sleep-ms", str(SLEEP_MS), *args],
            framework("torch"),
            2,
            settings,
            timeout_s=240,
        )
        assert "error" not in result, result
        found[name] = result["breakdown"]
        print(name, found[name]["ranks"])
    return found


def _parts(breakdown, rank):
    return breakdown["ranks"][rank]["parts_ms"]


def test_the_parts_add_up_to_the_step_and_every_step_is_profiled_before_the_window(breakdowns):
    for name, breakdown in breakdowns.items():
        assert breakdown["steps"] == [4, 3 + PROFILED_STEPS], name
        for rank in breakdown["ranks"]:
            named = sum(rank["parts_ms"][part] for part in PARTS if part != "other")
            # the remainder, under 10 %
            assert abs(rank["step_ms"] - named) <= 0.1 * rank["step_ms"], (name, rank)


def test_a_slow_data_loader_on_rank_1_is_its_data_wait_and_rank_0_waits_for_it(breakdowns):
    breakdown = breakdowns["slow data on rank 1"]
    assert _parts(breakdown, 1)["data"] == pytest.approx(SLEEP_MS, rel=0.2)
    assert _parts(breakdown, 0)["straggler"] == pytest.approx(SLEEP_MS, rel=0.2)
    assert (
        _parts(breakdown, 0)["data"] < 0.2 * SLEEP_MS
        and _parts(breakdown, 1)["straggler"] < 0.2 * SLEEP_MS
    )
    why = explain(breakdown)
    assert (
        why["part"] == "straggler"
        and "for rank 1" in why["line"]
        and "data loader waits" in why["line"]
    ), why
    assert "num_workers=0" in why["line"] and "num_workers=2" in why["line"]


def test_a_slow_sample_now_and_then_on_rank_1_is_named_as_its_data_wait_over_the_window(
    breakdowns,
):
    breakdown = breakdowns["slow sample now and then on rank 1"]
    window = breakdown["window"]
    quiet, slow = window["ranks"]
    print("window", window, "profiled", [r["step_ms"] for r in breakdown["ranks"]])
    # now and then, not every batch: the window's every step saw it, on rank 1 only
    assert 0 < slow["slow_batches"] <= window["steps"] / 2, window
    assert slow["data_max_ms"] >= SLOW_SAMPLE_MS and slow["data_ms"] > 5 * quiet["data_ms"], window
    why = explain(breakdown)
    assert why is not None and why["part"] == "data" and why["rank"] == 1, why
    assert why["line"].startswith(f"rank 1 waits {slow['data_ms']:.1f} ms a step"), why
    assert f"{slow['slow_batches']} of them over half a step" in why["line"], why


def test_a_slow_forward_on_rank_1_names_rank_1_as_the_straggler(breakdowns):
    breakdown = breakdowns["slow forward on rank 1"]
    assert _parts(breakdown, 1)["forward"] - _parts(breakdown, 0)["forward"] == pytest.approx(
        SLEEP_MS, rel=0.2
    )
    assert _parts(breakdown, 0)["straggler"] == pytest.approx(SLEEP_MS, rel=0.2)
    why = explain(breakdown)
    assert (
        why["part"] == "straggler"
        and "for rank 1" in why["line"]
        and "its forward takes" in why["line"]
    ), why


def _line(text: str) -> int:
    return next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


def test_a_per_step_barrier_and_item_are_host_syncs_named_by_line(breakdowns):
    expected = {
        f"barrier at injected.py:{_line('dist.barrier()')}",
        f".item() at injected.py:{_line('loss.item()')}",
    }
    for rank in breakdowns["barrier and item"]["ranks"]:
        assert set(rank["sync_ms"]) == expected, rank
    for name in ("clean", "slow data on rank 1"):  # (no sync the script did not make)
        assert all(not rank["sync_ms"] for rank in breakdowns[name]["ranks"])


def test_tiny_ddp_buckets_expose_more_communication_and_are_named(breakdowns):
    def comm(name):
        return max(rank["parts_ms"]["comm"] for rank in breakdowns[name]["ranks"])

    assert (
        breakdowns["tiny buckets"]["facts"]["ddp"]["buckets"]
        > breakdowns["clean"]["facts"]["ddp"]["buckets"]
    )
    assert comm("tiny buckets") > comm("clean")
    # The largest loss is the exchange: exposed, or (on a loaded machine) as one rank's later
    # arrival, the many all-reduces launched from its backward; when it is the exposed part, the
    # line names the buckets.
    why = explain(breakdowns["tiny buckets"])
    assert why["part"] in ("comm", "straggler"), why
    assert why["part"] != "comm" or "bucket_cap_mb=25" in why["line"], why


def test_a_clean_script_has_no_straggler_data_or_sync_cause(breakdowns):
    why = explain(breakdowns["clean"])
    assert why["part"] in (None, "comm"), why  # (DDP's exchange over gloo is real, not injected)
