"""rankwise plan's step-time model: compute at a stated efficiency, alpha-beta collectives, what
computation hides."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from rankwise.errors import ConfigError
from rankwise.tools.plan import devices
from rankwise.tools.plan.comms import Bandwidth, Collective, from_comm_bench, from_device
from rankwise.tools.plan.fake_step import Trace
from rankwise.tools.plan.timing import Timed, step_time

H100 = devices.GPUS["h100"]
LINK = Bandwidth(
    dict.fromkeys(("all_reduce", "all_gather", "reduce_scatter"), 100e9),
    dict.fromkeys(("all_reduce", "all_gather", "reduce_scatter"), 0.0),
)


def fake_trace(flops: int = 10**15, forward: int = 10**15 // 3) -> Trace:
    return Trace(
        rows=1,
        param_dtype="float32",
        autocast=None,
        checkpointed=False,
        numels=[10**9],
        param_bytes=4 * 10**9,
        buffer_bytes=0,
        input_bytes=0,
        gradient_bytes=4 * 10**9,
        optimizer_bytes=8 * 10**9,
        optimizer_moments=2,
        flops=flops,
        forward_flops=forward,
    )


def test_compute_is_the_flops_at_the_stated_efficiency_of_the_datasheet_peak():
    t = step_time("single", fake_trace(), 1, 1, H100, True, [], LINK)
    assert t.compute_s == pytest.approx(1e15 / (989.4e12 * 0.4))
    assert t.efficiency == pytest.approx(0.4)
    # the optimizer reads and writes parameters and state and reads gradients once, at the HBM
    # bandwidth
    assert t.optimizer_s == pytest.approx((2 * 4e9 + 4e9 + 2 * 8e9) / 3.35e12)
    assert t.exposed_comm_s == 0 and t.total_s == t.compute_s + t.optimizer_s


def test_a_sharding_strategy_steps_a_shard_of_the_state():
    one = step_time("ddp", fake_trace(), 8, 1, H100, True, [], LINK)
    sharded = step_time("deepspeed-zero1", fake_trace(), 8, 1, H100, True, [], LINK)
    assert sharded.optimizer_s == pytest.approx(one.optimizer_s / 8)


def test_backward_communication_is_hidden_by_the_backward_pass_except_its_last_call():
    # 1 GB at 8 ranks: 17.5 ms
    hidden = [Collective("all_reduce", 10**9, 4, "backward", "gradients")]
    t = step_time("ddp", fake_trace(), 8, 1, H100, True, hidden, LINK)
    assert t.comm_s == pytest.approx(2 * 7 / 8 * 1e9 / 100e9)
    # the last bucket: ready when the pass ends
    assert t.exposed_comm_s == pytest.approx(t.comm_s / 4)
    apart = [Collective("reduce_scatter", 10**9, 4, "", "gradients")]
    assert step_time(
        "deepspeed-zero2", fake_trace(), 8, 1, H100, True, apart, LINK
    ).exposed_comm_s == pytest.approx(7 / 8 * 1e9 / 100e9)
    tiny = fake_trace(flops=10**9, forward=10**9 // 3)  # a pass shorter than its communication
    t = step_time("ddp", tiny, 8, 1, H100, True, hidden, LINK)
    backward = 10**9 * 2 / 3 / (989.4e12 * 0.4)
    assert t.exposed_comm_s == pytest.approx(t.comm_s - backward)


def test_a_device_that_cannot_overlap_hides_nothing():
    cpu = replace(H100, overlaps=False)
    calls = [Collective("all_reduce", 10**9, 4, "backward", "gradients")]
    t = step_time("ddp", fake_trace(), 8, 1, cpu, True, calls, LINK)
    assert t.exposed_comm_s == t.comm_s and "none" in t.overlap


def test_a_timed_step_replaces_the_flop_estimate():
    t = step_time("fsdp", fake_trace(), 2, 2, H100, False, [], LINK, Timed(0.25, "timed"))
    assert (t.compute_s, t.optimizer_s, t.total_s) == (0.25, 0.0, 0.25)
    assert t.efficiency == pytest.approx(2e15 / (66.9e12 * 0.25))


def test_links_inside_and_across_nodes():
    inside, across = from_device(H100, 1), from_device(H100, 2)
    assert inside.busbw["all_reduce"] == pytest.approx(450e9 * devices.LINK_EFFICIENCY)
    assert across.busbw["all_reduce"] == pytest.approx(400e9 / 8 * devices.LINK_EFFICIENCY)


def test_comm_bench_results_calibrate_the_model(tmp_path):
    rows = [
        {"op": "all_reduce", "bytes": b, "time_us": t, "busbw_GBps": g}
        for b, t, g in (
            (4, 80.0, 0.0001),
            (2**20, 1200.0, 0.9),
            (8 * 2**20, 8000.0, 1.05),
            (64 * 2**20, 60000.0, 1.1),
        )
    ]
    path = tmp_path / "comm.json"
    path.write_text(json.dumps({"world_size": 2, "backend": "gloo", "nnodes": 1, "results": rows}))
    bandwidth, nodes = from_comm_bench(path)
    # median of the >= 4 MiB rows
    assert nodes == 1 and bandwidth.busbw["all_reduce"] == pytest.approx(1.075e9)
    assert bandwidth.latency_s["all_reduce"] == pytest.approx(80e-6)
    # not measured: the all_reduce's ring
    assert bandwidth.busbw["all_gather"] == bandwidth.busbw["all_reduce"]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a comm.json"):
        from_comm_bench(tmp_path / "bad.json")


def test_a_call_between_computations_costs_what_was_measured_where_every_core_computes(tmp_path):
    rows = [
        {"op": "all_gather", "bytes": b, "time_us": t, "busbw_GBps": g}
        for b, t, g in ((4, 200.0, 0.0001), (8 * 2**20, 8000.0, 1.0))
    ]
    (tmp_path / "comm.json").write_text(json.dumps({"world_size": 2, "results": rows}))
    # not measured: the latency stands in
    assert from_comm_bench(tmp_path / "comm.json")[0].call_s == {}
    (tmp_path / "between.json").write_text(
        json.dumps({"world_size": 2, "call_us": {"all_gather": 2000.0}})
    )
    bandwidth, _ = from_comm_bench(tmp_path / "comm.json")
    assert (
        bandwidth.call_s == {"all_gather": pytest.approx(2e-3)}
        and "between computations" in bandwidth.source
    )
    by_bytes = 2**20 * 0.5 / 1e9
    assert bandwidth.seconds("all_gather", 2**20, 3, 2) == pytest.approx(3 * 200e-6 + by_bytes)
    assert bandwidth.seconds("all_gather", 2**20, 3, 2, busy=True) == pytest.approx(
        3 * 2e-3 + by_bytes
    )
    # every core computes: each call costs what was measured between them
    cpu = replace(H100, overlaps=False)
    t = step_time(
        "fsdp",
        fake_trace(),
        2,
        1,
        cpu,
        False,
        [Collective("all_gather", 2**20, 3, "forward", "p")],
        bandwidth,
    )
    assert t.exposed_comm_s == pytest.approx(3 * 2e-3 + by_bytes)
    (tmp_path / "between.json").write_text(
        json.dumps({"world_size": 4, "call_us": {"all_gather": 2000.0}})
    )
    # measured at another world size: not used
    assert from_comm_bench(tmp_path / "comm.json")[0].call_s == {}


def test_devices_from_their_datasheets_and_refusals():
    assert H100.memory_bytes == 80 * 2**30 and H100.peak_16 == pytest.approx(989.4e12)
    assert devices.lookup("a100", 8).peak_fp32 == pytest.approx(19.5e12)
    with pytest.raises(ConfigError, match="--device"):
        devices.lookup("tpu", 8)


def test_a_timed_step_carries_its_spread_as_noise_and_ties_rows_within_it():
    """Two plans of one script once gave 39.1 and 89.7 ms for one row and "fastest" flipped: a
    timed step's spread is its noise, and rows within it of the shortest are ties, of which the
    smallest memory is named."""
    from types import SimpleNamespace

    from rankwise.tools.plan.planner import Plan

    timed = step_time("ddp", fake_trace(), 2, 1, H100, False, [], LINK, Timed(0.1, "t", 0.2))
    assert timed.noise == pytest.approx(0.2)

    def row(name, seconds, noise, peak):
        time = SimpleNamespace(total_s=seconds, noise=noise)
        return SimpleNamespace(
            strategy=name, world_size=2, fits=True, time=time, memory=SimpleNamespace(peak=peak)
        )

    quiet = SimpleNamespace(rows=[row("ddp", 0.100, 0.0, 9), row("zero2", 0.104, 0.0, 5)])
    assert [r.strategy for r in Plan.ties(quiet, 2)] == ["ddp"]
    noisy = SimpleNamespace(rows=[row("ddp", 0.100, 0.0, 9), row("zero2", 0.104, 0.08, 5)])
    assert [r.strategy for r in Plan.ties(noisy, 2)] == ["ddp", "zero2"]
    noisy.ties = lambda world: Plan.ties(noisy, world)
    assert Plan.fastest(noisy, 2).strategy == "zero2"  # tied: the smaller memory


def test_timing_goes_on_until_the_steps_are_stable_or_the_budget_is_spent():
    from rankwise.tools.plan.calibrate import MAX_REPEATS, MAX_TIMING_S, REPEATS, enough, spread

    steady = [0.100, 0.101, 0.099, 0.100, 0.100]
    assert spread(steady) < 0.05 and enough(steady, 1.0)
    assert not enough(steady[:4], 1.0)  # (too few)
    jumpy = [0.039, 0.090, 0.041, 0.088, 0.060]
    assert spread(jumpy) > 0.5 and not enough(jumpy, 1.0)
    assert enough(jumpy, MAX_TIMING_S) and enough(jumpy * MAX_REPEATS, 1.0)
    assert REPEATS == len(steady)
