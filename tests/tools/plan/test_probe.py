"""The probe's peak memory from the profiler's memory events, read as a ledger of blocks by address."""

from __future__ import annotations

from rankwise.tools.plan.probe import live_bytes, peak_between


def test_a_block_freed_on_a_thread_the_profiler_does_not_see_stops_counting_when_its_address_is_reused():
    events = [(0, 0xA, 100),     # before the measured span: the script's own (its dataset)
              (10, 0xB, 50),     # a gloo buffer; its free comes on gloo's thread, unseen
              (20, 0xC, 30), (25, 0xC, -30),
              (30, 0xB, 50),     # the same address again: the first block was freed before
              (40, 0xD, 20), (50, 0xA, -100)]  # a free of an older block still counts, as before
    series = live_bytes(events, since=5, baseline=1000)
    assert [live for _, live in series] == [1050, 1080, 1050, 1050, 1070, 970]
    assert peak_between(series, 15, 45, 1000) == (1080, 1070)
    # without the ledger the second gloo buffer would add up: 1130 at time 40


def test_a_span_without_events_holds_what_was_live_before_it():
    series = live_bytes([(10, 0xA, 64)], since=0, baseline=0)
    assert peak_between(series, 20, 30, 0) == (64, 64)
