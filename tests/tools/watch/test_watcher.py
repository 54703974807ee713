"""The watcher's timed window (a benchmark's throughput), decided on one process with a clock the
test drives."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rankwise.measure.throughput import MIN_WINDOW_S
from rankwise.tools.watch import window
from rankwise.tools.watch.settings import WatchSettings
from rankwise.tools.watch.step_watch import StepWatch
from rankwise.tools.watch.watcher import WatchDone, Watcher


@pytest.mark.parametrize("first_step_s, speed_up", [(0.010, 0.985), (0.001, 1.0), (0.002, 1.0005)])
def test_the_window_lasts_its_seconds_whatever_the_pace_does_on_the_way(
    tmp_path, monkeypatch, first_step_s, speed_up
):
    """Under load a fast script's first steps are slow and its later ones fast (or the other way
    round): the window is pushed further until it lasted MIN_WINDOW_S, never cut short after a fixed
    number of decisions."""
    now, step_s = [0.0], [first_step_s]
    clock = SimpleNamespace(perf_counter=lambda: now[0])
    monkeypatch.setattr(window, "time", clock)  # (the window times the steps and reports them)
    watcher = Watcher(WatchSettings(tmp_path, watched_steps=10, warmup=1, trace=False))
    with pytest.raises(WatchDone):
        for _ in range(20_000):
            now[0] += step_s[0]
            # (at most MAX_WINDOW_STEPS fit in the window)
            step_s[0] = max(step_s[0] * speed_up, 1e-3)
            watcher.step_ends([], dict, lambda theirs: None)
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert MIN_WINDOW_S <= probe["steady_s"] < 1.5 * MIN_WINDOW_S, probe


def test_the_step_part_is_named_after_its_module_and_steps_names_nothing(tmp_path):
    """``watcher.steps`` was the StepWatch part while ``steps`` also meant a count: the part is
    ``step_watch`` (as ``calls``, ``data``, ``saves`` are named), the count ``watched_steps``."""
    watcher = Watcher(WatchSettings(tmp_path, watched_steps=3))
    assert isinstance(watcher.step_watch, StepWatch)
    assert not hasattr(watcher, "steps") and not hasattr(watcher.settings, "steps")
    watcher.step_watch.count_step()
    assert watcher.step == 1  # (the watcher's step is its part's)
