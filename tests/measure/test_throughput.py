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
