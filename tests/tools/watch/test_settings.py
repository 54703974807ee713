"""The watcher's settings, parsed once from the variables a tool hands each rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankwise.measure.throughput import MIN_WINDOW_S
from rankwise.tools.watch import settings as names
from rankwise.tools.watch.settings import WatchSettings

pytestmark = pytest.mark.unit


def test_unset_variables_take_the_defaults():
    parsed = WatchSettings.from_environment({names.DIRECTORY: "/tmp/run"})
    assert parsed == WatchSettings(
        Path("/tmp/run"),
        steps=20,
        warmup=1,
        follow=None,
        scale=1,
        keep_dropout=False,
        trace=False,
        min_window_s=MIN_WINDOW_S,
        after="stop",
        profile_steps=0,
        stall_s=0.0,
        spawn="",
    )


def test_what_a_tool_hands_a_rank_is_read_as_it_means():
    """As ``tools/watch/runs.py`` writes them: an empty follow is none, ``off`` dropout is switched
    off."""
    parsed = WatchSettings.from_environment(
        {
            names.DIRECTORY: "/tmp/run",
            names.STEPS: "8",
            names.WARMUP: "3",
            names.TRACE: "1",
            names.DROPOUT: "off",
            names.SCALE: "2",
            names.FOLLOW: "",
            names.MIN_WINDOW: "0.5",
            names.STALL: "30",
            names.SPAWN: "one",
            names.AFTER: "shorten",
            names.PROFILE: "4",
        }
    )
    assert (
        parsed.steps,
        parsed.warmup,
        parsed.trace,
        parsed.keep_dropout,
        parsed.scale,
        parsed.follow,
    ) == (8, 3, True, False, 2, None)
    assert (
        parsed.min_window_s,
        parsed.stall_s,
        parsed.spawn,
        parsed.after,
        parsed.profile_steps,
    ) == (0.5, 30.0, "one", "shorten", 4)
    following = WatchSettings.from_environment(
        {names.DIRECTORY: "/tmp/ref", names.FOLLOW: "/tmp/run", names.DROPOUT: "keep"}
    )
    assert following.follow == Path("/tmp/run") and following.keep_dropout


def test_the_warm_up_leaves_at_least_one_step_timed_and_is_at_least_one():
    assert (
        WatchSettings.from_environment(
            {names.DIRECTORY: "d", names.STEPS: "4", names.WARMUP: "9"}
        ).warmup
        == 3
    )
    assert (
        WatchSettings.from_environment(
            {names.DIRECTORY: "d", names.STEPS: "4", names.WARMUP: "0"}
        ).warmup
        == 1
    )


def test_an_unknown_after_is_refused_and_the_settings_are_frozen():
    with pytest.raises(ValueError, match="after='later': one of stop, shorten, as-written"):
        WatchSettings("d", steps=2, after="later")
    with pytest.raises(AttributeError):
        WatchSettings("d", steps=2).steps = 3
    assert WatchSettings("d", steps=2, follow="f").directory == Path("d")
