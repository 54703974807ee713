"""A benchmark's timed window: long enough to mean something, never longer than it must be."""

from rankwise.measure.throughput import MAX_WINDOW_STEPS, MIN_WINDOW_S, window_end


def test_a_window_that_lasted_long_enough_ends_where_asked():
    assert window_end(20, 1, MIN_WINDOW_S + 0.1) == 20


def test_a_short_window_runs_on_to_the_step_that_makes_it_last_at_the_pace_so_far():
    # 19 timed steps of 1 ms: about 2,100 timed steps make 2 s (with 5 % margin)
    end = window_end(20, 1, 0.019)
    assert 2000 < end - 1 < 2200
    assert window_end(20, 1, 1.9) == 23  # nearly there (0.1 s a step): 22 timed steps give 2.1 s


def test_the_extension_is_capped():
    assert window_end(20, 1, 1e-9) == 1 + MAX_WINDOW_STEPS
    assert window_end(1 + MAX_WINDOW_STEPS, 1, 0.5) == 1 + MAX_WINDOW_STEPS


def test_the_warm_up_is_timed_apart_from_the_steady_rates(monkeypatch):
    """A compiled model's first steps (the compile) are the warm-up's seconds, not the rate's."""
    from rankwise.measure import throughput

    now = iter([0.0, 30.0, 31.0, 32.0, 33.0])  # start, then the end of each of four steps
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: next(now))
    meter = throughput.SteadyThroughput(warmup_steps=1)
    for _ in range(4):
        meter.step(samples=8, tokens=0)
    rates = meter.rates()
    assert (rates["warmup_steps"], rates["warmup_s"]) == (1, 30.0)
    assert (rates["steady_steps"], rates["steady_samples_per_s"]) == (3, 8.0)
