"""The probe's peak memory from the profiler's memory events, read as a ledger of blocks by
address."""

from __future__ import annotations

from rankwise.tools.plan.probe import live_bytes, peak_between


def test_a_block_freed_on_a_thread_the_profiler_misses_stops_counting_when_its_address_is_reused():
    events = [
        (0, 0xA, 100),  # before the measured span: the script's own (its dataset)
        (10, 0xB, 50),  # a gloo buffer; its free comes on gloo's thread, unseen
        (20, 0xC, 30),
        (25, 0xC, -30),
        (30, 0xB, 50),  # the same address again: the first block was freed before
        (40, 0xD, 20),
        (50, 0xA, -100),
    ]  # a free of an older block still counts, as before
    series = live_bytes(events, since=5, baseline=1000)
    assert [live for _, live in series] == [1050, 1080, 1050, 1050, 1070, 970]
    assert peak_between(series, 15, 45, 1000) == (1080, 1070)
    # without the ledger the second gloo buffer would add up: 1130 at time 40


def test_a_span_without_events_holds_what_was_live_before_it():
    series = live_bytes([(10, 0xA, 64)], since=0, baseline=0)
    assert peak_between(series, 20, 30, 0) == (64, 64)


def test_on_a_gpu_each_measured_step_s_peak_is_the_allocator_s_own_count(tmp_path, monkeypatch):
    """The CUDA wiring (no GPU here): each measured step's peak is max_memory_allocated since the
    step before."""
    import json
    from types import SimpleNamespace

    import pytest
    import torch

    from rankwise.runtime import observers
    from rankwise.tools.plan.probe import MEASURED_STEPS, TIMED_STEPS, Probe

    peaks, resets = iter(range(100, 10_000, 100)), []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: next(peaks))
    monkeypatch.setattr(
        torch.cuda, "reset_peak_memory_stats", lambda device=None: resets.append(device)
    )
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 42)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    probe = Probe(tmp_path, cuda=True)
    assert probe.profiler is None
    rt = SimpleNamespace(device="cuda:0", steps=0, rank=0, world_size=1, strategy_name="ddp")
    probe.prepared(rt, torch.nn.Linear(2, 2), 1)
    with pytest.raises(observers.Finished):
        for step in range(1, MEASURED_STEPS[-1] + TIMED_STEPS + 3):
            rt.steps = step
            probe.stepped(rt, None)
    result = json.loads((tmp_path / "probe-rank0.json").read_text())
    # steps 3, 4, 5: the median
    assert result["step_peaks"] == [100, 200, 300] and result["peak_bytes"] == 200
    assert len(resets) == 1 + MEASURED_STEPS[-1] and result["held_bytes"] == 42
    assert len(result["step_intervals_s"]) == TIMED_STEPS
