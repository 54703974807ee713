import pytest

from rankwise.train.config import ConfigError, build_config
from rankwise.train.schedule import Schedule


def _steps(decide, first: int = 1) -> list[int]:
    """The steps of a run at which ``decide`` (a bound method of a :class:`Schedule`) says to
    act."""
    return [step for step in range(first, decide.__self__.total_steps + 1) if decide(step)]


def test_the_loss_is_logged_every_n_steps_and_at_the_last():
    schedule = Schedule.of(total_steps=10, steps_per_epoch=4, log_every=3)
    assert _steps(schedule.should_log) == [3, 6, 9, 10]
    assert _steps(Schedule.of(total_steps=9, steps_per_epoch=9, log_every=3).should_log) == [
        3,
        6,
        9,
    ]
    assert _steps(Schedule.of(total_steps=5, steps_per_epoch=5, log_every=20).should_log) == [5]


def test_step_zero_is_never_acted_on():
    schedule = Schedule.of(
        total_steps=8, steps_per_epoch=4, log_every=1, save_every=2, save_at_steps=[0]
    )
    assert not (
        schedule.should_log(0)
        or schedule.should_save(0)
        or schedule.epoch_ends(0)
        or schedule.should_evaluate(0)
    )


def test_checkpoints_every_n_steps_or_at_listed_steps_not_both_required():
    # The old inline test was `save_every and step % save_every == 0 or step in save_at_steps`:
    # either one.
    schedule = Schedule.of(
        total_steps=12, steps_per_epoch=12, log_every=1, save_every=5, save_at_steps=[3, 5]
    )
    assert _steps(schedule.should_save) == [3, 5, 10]
    listed_only = Schedule.of(
        total_steps=12, steps_per_epoch=12, log_every=1, save_at_steps=[7, 99]
    )
    assert _steps(listed_only.should_save) == [7]
    # save_every None
    assert _steps(Schedule.of(total_steps=12, steps_per_epoch=4, log_every=1).should_save) == []


def test_epochs_end_at_each_epochs_last_step_and_at_max_steps_mid_epoch():
    schedule = Schedule.of(total_steps=10, steps_per_epoch=4, log_every=1)
    assert _steps(schedule.epoch_ends) == [4, 8, 10]
    assert schedule.epoch_of(0) == 0 and schedule.epoch_of(4) == 1 and schedule.epoch_of(9) == 2
    assert schedule.done(10) and schedule.done(11) and not schedule.done(9)


def test_dev_is_evaluated_at_epoch_ends_only_when_asked():
    asked = Schedule.of(total_steps=8, steps_per_epoch=4, log_every=1)
    assert _steps(asked.should_evaluate) == [4, 8]
    not_asked = Schedule.of(total_steps=8, steps_per_epoch=4, log_every=1, evaluate_dev=False)
    assert _steps(not_asked.should_evaluate) == []
    assert _steps(not_asked.epoch_ends) == [4, 8]  # still checkpointed there


def test_a_resumed_run_acts_at_the_steps_an_uninterrupted_run_does():
    schedule = Schedule.of(
        total_steps=14, steps_per_epoch=5, log_every=3, save_every=4, save_at_steps=[6]
    )
    for decide in (
        schedule.should_log,
        schedule.should_save,
        schedule.epoch_ends,
        schedule.should_evaluate,
    ):
        whole = _steps(decide)
        assert _steps(decide, first=7) == [step for step in whole if step >= 7]


def test_a_schedule_refuses_intervals_below_one():
    for bad in ({"log_every": 0}, {"save_every": 0}, {"steps_per_epoch": 0}):
        with pytest.raises(ValueError, match="must be >= 1"):
            Schedule.of(**{"total_steps": 4, "steps_per_epoch": 2, "log_every": 1, **bad})


@pytest.mark.parametrize("setting", ["log_every=0", "save_every=0"])
def test_the_config_refuses_intervals_below_one(setting):
    with pytest.raises(ConfigError, match=setting.split("=")[0]):
        build_config(overrides=["data.source=toy", setting])
