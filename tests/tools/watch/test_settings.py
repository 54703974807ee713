"""The watcher's settings: built once by the tool, crossing to each rank whole as one value, with
one set of defaults."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from rankwise.measure.throughput import MIN_WINDOW_S
from rankwise.tools.watch.settings import VARIABLE, WatchSettings

pytestmark = pytest.mark.unit


def test_the_settings_cross_to_a_rank_whole_as_one_variable(tmp_path):
    sent = WatchSettings(
        tmp_path / "run",
        watched_steps=8,
        warmup=3,
        follow=tmp_path / "candidate",
        scale=2,
        keep_dropout=True,
        trace=False,
        min_window_s=0.5,
        after="shorten",
        profile_steps=4,
        stall_s=30.0,
        spawn="one",
    )
    environment = sent.to_environment()
    assert list(environment) == [VARIABLE]  # one variable, whatever the settings
    assert WatchSettings.from_environment(environment) == sent


def test_the_defaults_are_the_dataclasss_own(tmp_path):
    """What a tool leaves unset reaches the rank as the dataclass's default: there is no second
    set of defaults in the parsing (it had 20 steps where verify's default is 5)."""
    sent = WatchSettings(tmp_path, watched_steps=5)
    received = WatchSettings.from_environment(sent.to_environment())
    assert received == sent
    assert (received.warmup, received.follow, received.trace, received.min_window_s) == (
        1,
        None,
        True,
        MIN_WINDOW_S,
    )
    with pytest.raises(TypeError):  # no default number of steps: the tool says how many
        WatchSettings.from_environment({VARIABLE: json.dumps({"directory": str(tmp_path)})})


def test_the_warm_up_leaves_at_least_one_step_timed_and_is_at_least_one():
    assert WatchSettings("d", watched_steps=4, warmup=9).warmup == 3
    assert WatchSettings("d", watched_steps=4, warmup=0).warmup == 1


def test_an_unknown_after_is_refused_and_the_settings_are_frozen():
    with pytest.raises(ValueError, match="after='later': one of stop, shorten, as-written"):
        WatchSettings("d", watched_steps=2, after="later")
    with pytest.raises(AttributeError):
        WatchSettings("d", watched_steps=2).watched_steps = 3  # type: ignore[misc]  # (frozen: the point)
    assert WatchSettings("d", watched_steps=2, follow="f").directory == Path("d")
    assert replace(WatchSettings("d", watched_steps=2), spawn="one").spawn == "one"


def test_the_steps_watched_have_their_own_name_in_the_settings_and_the_variable(tmp_path):
    """``steps`` meant three things in the watcher (this count, the watcher's step part, verify's
    per-step lines): the count is ``watched_steps``, as the rank reads it from the variable."""
    names = [field.name for field in fields(WatchSettings)]
    assert "watched_steps" in names and "steps" not in names
    sent = json.loads(WatchSettings(tmp_path, watched_steps=7).to_environment()[VARIABLE])
    assert sent["watched_steps"] == 7 and "steps" not in sent
    with pytest.raises(TypeError):  # (the old name is no setting)
        WatchSettings(tmp_path, steps=7)  # type: ignore[call-arg]
