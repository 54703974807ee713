"""The timed window's every step (unit): a slow sample now and then is the rank's data wait over
the whole window; a pause of the machine is left out."""

import pytest

from rankwise.measure.window_steps import data_excess, paused, summary


def test_a_slow_sample_one_step_in_four_is_the_ranks_data_wait_over_the_window():
    # Rank 1 waits 40 ms for its batch in one step of four; rank 0 waits as long at the exchange.
    steps = [0.050 if i % 4 == 0 else 0.010 for i in range(40)]
    rank_1_data = [0.0405 if i % 4 == 0 else 0.0005 for i in range(40)]
    window = summary([steps, steps], [[0.0005] * 40, rank_1_data])
    assert window is not None and window["steps"] == 40 and window["paused"] == 0
    assert window["step_ms"] == pytest.approx(20.0)
    quiet, slow = window["ranks"]
    assert slow["data_ms"] == pytest.approx(10.5) and quiet["data_ms"] == pytest.approx(0.5)
    assert slow["data_max_ms"] == pytest.approx(40.5) and slow["slow_batches"] == 10
    assert slow["slow_ms"] == pytest.approx(10.125)  # most of its wait: in those ten batches
    assert quiet["slow_batches"] == 0


def test_a_step_a_busy_machine_paused_is_left_out_of_the_window_too():
    steps = [0.010] * 9 + [0.100]
    window = summary([steps], [[0.001] * 10])
    assert window is not None and window["paused"] == 1
    assert window["step_ms"] == pytest.approx(10.0)


def test_a_pause_is_over_the_outlier_and_not_a_data_wait():
    walls = [0.010, 0.010, 0.010, 0.040, 0.040]
    excess = data_excess([[0.001, 0.001, 0.001, 0.001, 0.030], [0.001] * 5])
    assert excess == pytest.approx([0.0, 0.0, 0.0, 0.0, 0.029])
    # the fourth step: a pause; the fifth: a wait for the data that explains most of its excess
    assert paused(walls, excess) == [False, False, False, True, False]


def test_no_timed_step_no_window():
    assert summary([], []) is None and summary([[], []], [[], []]) is None
