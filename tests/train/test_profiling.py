"""The training app's step-time breakdown (unit, one process): every step of the timed window is
timed with its wait for its batches, so a slow batch now and then is named as the rank's data wait
over the window; the run's last steps are profiled, after the window (the profiler slows the steps
that follow it)."""

import pytest
import torch

from rankwise.tools.bench.why import explain
from rankwise.train import profiling
from rankwise.train.profiling import LoopProfile


class OneProcess:
    def barrier(self):
        pass

    def all_gather_object(self, obj):
        return [obj]


def test_a_slow_batch_now_and_then_in_the_window_is_the_ranks_data_wait(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(profiling, "perf_counter", lambda: clock[0])

    class Loader:
        """Twelve batches; every fourth takes 40 ms to build, the others 1 ms."""

        def __len__(self):
            return 12

        def __iter__(self):
            for i in range(12):
                clock[0] += 0.040 if i % 4 == 3 else 0.001
                yield i

    loop = LoopProfile(OneProcess(), steps=2, after=10, window_from=1)
    for step, _ in enumerate(loop.timed(Loader()), 1):
        clock[0] += 0.010  # the step's compute
        loop.step_ended(step)
        # the window (steps 2-10) is over before the profiler starts
        assert loop.profile is not None and loop.profile.running is (step in (10, 11))
    # step 1 the warm-up; steps 2-10 timed, each with its batch's wait; steps 11-12 profiled
    assert loop.data_seconds == pytest.approx(
        [0.001, 0.001, 0.040] + [0.001] * 3 + [0.040] + [0.001] * 2
    )
    breakdown = loop.breakdown(torch.nn.Linear(2, 2), "cpu", 0.020)
    assert breakdown is not None and breakdown["steps"] == [11, 12]
    window = breakdown["window"]
    assert window["steps"] == 9 and window["paused"] == 0
    (timed,) = window["ranks"]
    assert timed["data_ms"] == pytest.approx(87 / 9, abs=1e-3) and timed["slow_batches"] == 2
    why = explain(breakdown)
    assert why is not None and why["part"] == "data" and why["rank"] == 0, why
    assert "over the timed window's 9 steps" in why["line"], why


def test_a_run_that_profiles_nothing_times_nothing():
    loop = LoopProfile(OneProcess(), steps=0, after=0)
    loader = [1, 2, 3]
    assert loop.timed(loader) is loader
    loop.step_ended(1)
    assert loop.step_seconds == [] and loop.breakdown(torch.nn.Linear(2, 2), "cpu", None) is None
