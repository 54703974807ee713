"""The step-time breakdown from profiler spans (unit): regions per step, arrival times against the
last rank."""

import pytest
import torch

from rankwise.measure.breakdown import MARK, PARTS, Span, StepProfile, combine, step_records


def span(name, start, end, *children):
    # (milliseconds in, microseconds stored)
    return Span(name, start * 1e3, end * 1e3, children=list(children))


def a_step(
    start,
    *,
    data=1.0,
    forward=2.0,
    backward=3.0,
    backward_compute=2.0,
    optimizer=1.0,
    sync=(),
    gap=0.5,
):
    """A step of the given parts (milliseconds), laid out one after another from ``start``."""
    t = start
    spans = [span("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, t + data)]
    t += data
    spans.append(span(MARK + "forward", t, t + forward, span("aten::addmm", t, t + forward)))
    t += forward + gap  # (a loss outside the model: an op outside every region)
    spans.append(span("aten::cross_entropy_loss", t - gap, t))
    spans.append(
        span(
            MARK + "backward",
            t,
            t + backward,
            span("autograd::engine::evaluate_function: AddmmBackward0", t, t + backward_compute),
        )
    )
    t += backward
    for site, seconds in sync:
        spans.append(span(f"{MARK}sync {site}", t, t + seconds))
        t += seconds
    spans.append(
        span(
            "Optimizer.step#AdamW.step",
            t,
            t + optimizer,
            span(MARK + "optimizer", t, t + optimizer),
        )
    )
    t += optimizer
    return span(MARK + "step", start, t, *spans), t


def rank_records(starts_and_parts):
    spans = [a_step(start, **parts)[0] for start, parts in starts_and_parts]
    return step_records(spans)


def test_a_step_splits_into_its_regions_and_they_add_up():
    root, end = a_step(0.0, sync=[("barrier at train.py:9", 0.25)])
    (record,) = step_records([root])
    assert record["wall"] == pytest.approx(end / 1e3)
    assert record["data"] == pytest.approx(1e-3)
    assert record["forward"] == pytest.approx(2.5e-3)  # the model's forward and the loss outside it
    assert record["backward_compute"] == pytest.approx(2e-3) and record[
        "backward"
    ] == pytest.approx(3e-3)
    # torch's span, rankwise's mark inside it not counted twice
    assert record["optimizer"] == pytest.approx(1e-3)
    assert record["arrival"] == pytest.approx(5.5e-3)  # where backward compute ended
    assert record["sync"] == [
        ("barrier at train.py:9", pytest.approx(6.5e-3), pytest.approx(0.25e-3))
    ]
    assert record["loader"] == "_SingleProcessDataLoaderIter"


def test_a_rank_that_arrives_late_makes_the_other_wait_and_the_wait_is_not_communication():
    # Rank 1's data takes 30 ms more; rank 0 waits for it in its backward (DDP's all-reduce), then 1
    # ms of exchange.
    late = [(0.0, {"data": 31.0, "backward": 4.0})]
    early = [(0.0, {"data": 1.0, "backward": 34.0})]
    ranks = combine([rank_records(early), rank_records(late)])
    waiting, straggler = ranks
    assert straggler["late_ms"] == pytest.approx(30.0)
    assert waiting["parts_ms"]["straggler"] == pytest.approx(30.0)
    assert waiting["parts_ms"]["comm"] == pytest.approx(2.0)  # 32 ms waited, 30 of them for rank 1
    assert straggler["parts_ms"]["straggler"] == 0 and straggler["parts_ms"][
        "comm"
    ] == pytest.approx(2.0)
    assert straggler["parts_ms"]["data"] == pytest.approx(31.0)
    for rank in ranks:  # the parts add up to the step, the remainder stated
        assert sum(rank["parts_ms"].values()) == pytest.approx(rank["step_ms"], abs=1e-3)
        assert set(rank["parts_ms"]) == set(PARTS)


def test_a_script_collective_reached_late_is_waiting_for_the_slowest_rank_not_a_host_sync():
    ranks = combine(
        [
            rank_records([(0.0, {"sync": [("barrier at t.py:3", 10.0)]})]),
            rank_records([(0.0, {"forward": 11.5, "sync": [("barrier at t.py:3", 0.5)]})]),
        ]
    )
    # 9.5 ms at the barrier, and the 1 ms its backward waited at the gradient exchange, before rank
    # 1 got there
    assert ranks[0]["parts_ms"]["straggler"] == pytest.approx(10.5)
    assert ranks[0]["parts_ms"]["sync"] == pytest.approx(0.5) and ranks[0]["parts_ms"]["comm"] == 0
    assert ranks[0]["sync_ms"] == {"barrier at t.py:3": pytest.approx(10.0)}


def test_a_step_a_busy_machine_paused_is_left_out_of_the_averages():
    steps = [(0.0, {}), (20.0, {}), (40.0, {"forward": 60.0}), (120.0, {})]
    (rank,) = combine([rank_records(steps)])
    assert rank["steps"] == 4 and rank["steps_kept"] == 3
    assert rank["parts_ms"]["forward"] == pytest.approx(2.5)


def test_a_step_slowed_by_one_ranks_data_wait_is_kept_on_every_rank():
    # A slow sample now and then: rank 1 waits 40 ms for one batch in four; rank 0 waits for it at
    # the gradient exchange.  Not a pause of the machine: the step is the script's, kept.
    slow = {"data": 41.0, "backward": 4.0}
    waits = {"data": 1.0, "backward": 44.0}
    starts = [0.0, 20.0, 40.0, 100.0]
    ranks = combine(
        [
            rank_records([(t, waits if i == 2 else {}) for i, t in enumerate(starts)]),
            rank_records([(t, slow if i == 2 else {}) for i, t in enumerate(starts)]),
        ]
    )
    assert [r["steps_kept"] for r in ranks] == [4, 4]
    assert ranks[1]["parts_ms"]["data"] == pytest.approx((3 * 1.0 + 41.0) / 4)
    assert ranks[0]["parts_ms"]["straggler"] == pytest.approx(40.0 / 4)


def test_no_steps_no_breakdown():
    assert combine([[], []]) == []


def test_the_profiler_marks_real_steps_on_this_thread():
    model, optimizer = torch.nn.Linear(8, 2), None
    optimizer = torch.optim.SGD(model.parameters())
    profile = StepProfile(2)
    profile.start(lambda: None)
    for _ in range(2):
        profile.begin("forward")
        loss = model(torch.randn(4, 8)).sum()
        profile.end("forward")
        with profile.mark("backward"):
            loss.backward()
        optimizer.step()
        profile.step_done()
    assert profile.finished and not profile.running
    records = profile.records()
    assert len(records) == 2
    assert all(
        r["forward"] > 0 and r["backward_compute"] > 0 and r["optimizer"] > 0 for r in records
    )
    assert all(r["wall"] >= r["forward"] + r["backward"] + r["optimizer"] for r in records)


def test_a_rank_the_last_exchange_let_go_later_is_not_a_straggler_its_wait_is_communication():
    # Both ranks do the same work; rank 1's step starts 4 ms later (its previous exchange ended
    # later), so rank 0 waits 4 ms more in its backward: communication, not a slower rank.
    ranks = combine(
        [rank_records([(0.0, {"backward": 8.0})]), rank_records([(4.0, {"backward": 4.0})])]
    )
    assert ranks[0]["parts_ms"]["straggler"] == 0 and ranks[0]["parts_ms"]["comm"] == pytest.approx(
        6.0
    )
    assert ranks[1]["late_ms"] == 0 and ranks[1]["last_in"] == 0


def test_one_process_has_no_communication_its_whole_backward_computes():
    (rank,) = combine([rank_records([(0.0, {"backward": 5.0, "backward_compute": 3.0})])])
    assert rank["parts_ms"]["comm"] == 0 and rank["parts_ms"]["backward"] == pytest.approx(5.0)


def test_forward_and_backward_inside_the_optimizer_step_count_as_themselves():
    # Lightning's automatic optimization: optimizer.step(closure), the closure runs forward and
    # backward.
    forward = span(MARK + "forward", 1.0, 4.0, span("aten::addmm", 1.0, 4.0))
    backward = span(
        MARK + "backward", 4.0, 9.0, span("autograd::engine::evaluate_function: X", 4.0, 9.0)
    )
    step = span(
        MARK + "step", 0.0, 10.0, span("Optimizer.step#SGD.step", 0.5, 10.0, forward, backward)
    )
    (record,) = step_records([step])
    assert record["forward"] == pytest.approx(3e-3) and record["backward_compute"] == pytest.approx(
        5e-3
    )
    # its own time, less the closure's forward and backward
    assert record["optimizer"] == pytest.approx(1.5e-3)


def test_a_collective_inside_the_optimizer_step_is_its_communication_not_a_host_sync():
    # DeepSpeed's engine.step(): its ZeRO all-gather, made through torch.distributed inside the
    # step.
    gather = span(
        MARK + "sync all_gather_into_tensor at train.py:9",
        2.0,
        5.0,
        span("c10d::allgather_", 2.0, 5.0),
    )
    step = span(MARK + "step", 0.0, 10.0, span("Optimizer.step#AdamW.step", 1.0, 9.0, gather))
    (record,) = step_records([step])
    assert record["sync"] == [] and record["optimizer"] == pytest.approx(8e-3)
    assert record["optimizer_comm"] == pytest.approx(3e-3)


def test_a_frameworks_wait_for_the_exchange_outside_backward_counts_as_the_exchange():
    # Horovod waits for its allreduce in the optimizer's synchronize, after backward: rank 0 waits
    # 20 ms there for rank 1, whose forward took 20 ms longer, then 1 ms for the exchange itself.
    def horovod_step(forward, exchange):
        t = 1.0 + forward + 3.0
        return span(
            MARK + "step",
            0.0,
            t + exchange + 1.0,
            span(MARK + "forward", 1.0, 1.0 + forward),
            span(
                MARK + "backward",
                1.0 + forward,
                t,
                span("autograd::engine::evaluate_function: X", 1.0 + forward, t),
            ),
            span(MARK + "exchange", t, t + exchange),
        )

    fast, slow = combine(
        [step_records([horovod_step(2.0, 21.0)]), step_records([horovod_step(22.0, 1.0)])]
    )
    assert fast["parts_ms"]["straggler"] == pytest.approx(20.0) and fast["parts_ms"][
        "comm"
    ] == pytest.approx(1.0)
    assert slow["late_ms"] == pytest.approx(20.0) and slow["parts_ms"]["comm"] == pytest.approx(1.0)
