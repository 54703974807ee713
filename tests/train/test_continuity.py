"""The continuity record: positions in the global order, and a resume that does not continue it is
caught."""

import pytest
from torch.utils.data import DataLoader

from rankwise.errors import ConfigError
from rankwise.sampling.batching import global_order, rank_sampler
from rankwise.train import continuity

SAMPLES, BATCH, SEED = 100, 8, 3  # 12 steps per epoch; the last 4 samples are dropped


def _facts(step: int, lengths=None) -> dict:
    sampler = continuity.training_sampler(SAMPLES, BATCH, SEED, lengths)
    return {
        **continuity.position(sampler, SAMPLES // BATCH, BATCH, step),
        "step": step,
        "data": "d",
        "lr": 1e-3,
    }


@pytest.mark.parametrize("lengths", [None, [i % 7 for i in range(SAMPLES)]])
def test_the_order_is_the_same_at_every_world_size_and_a_step_is_a_position_in_it(lengths):
    one = continuity.training_sampler(SAMPLES, BATCH, SEED, lengths)
    for world_size in (2, 4):
        ranks = [
            rank_sampler(
                range(SAMPLES),
                BATCH,
                world_size,
                r,
                shuffle=True,
                drop_last=True,
                seed=SEED,
                lengths=lengths,
                group_size=BATCH,
            )
            for r in range(world_size)
        ]
        assert global_order(ranks[0]) == global_order(one)
        shares = [list(s)[: BATCH // world_size] for s in ranks]  # each rank's first micro-batch
        assert sorted(i for share in shares for i in share) == sorted(global_order(one)[:BATCH])
    assert _facts(5, lengths)["position"] == 40 and _facts(5, lengths)["epoch"] == 0
    at_the_end = _facts(12, lengths)  # an epoch's last step: the next epoch, nothing of it consumed
    assert (at_the_end["epoch"], at_the_end["position"]) == (1, 0)
    # a new permutation each epoch
    assert _facts(12, lengths)["order"] != _facts(11, lengths)["order"]


class _OneRank:
    strategy_name, world_size = "single", 1

    @staticmethod
    def all_gather_object(value):
        return [value]


def _record(recorded: dict, step: int, trained_step: int | None = None) -> dict:
    """The record of a resume at ``step`` whose first step really trained global batch
    ``trained_step + 1``."""
    sampler = rank_sampler(range(SAMPLES), BATCH, 1, 0, shuffle=True, drop_last=True, seed=SEED)
    loader = DataLoader(range(SAMPLES), batch_size=BATCH, sampler=sampler, drop_last=True)
    at = step if trained_step is None else trained_step
    trained = list(sampler)[at * BATCH : (at + 1) * BATCH]
    return continuity.first_step_record(
        _OneRank(),
        loader,
        recorded,
        trained,
        step=step,
        steps_per_epoch=SAMPLES // BATCH,
        batch_size=BATCH,
        lr_resumed=1e-3,
        loss=0.5,
        data_digest="d",
        resumed_from="test",
    )


def test_a_resume_that_skips_or_repeats_samples_is_not_continuous():
    assert _record(_facts(5), 5)["continuous"]
    # the run goes on at step 5 from a checkpoint that consumed only 4 steps
    skipped = _record(_facts(4), 5)
    assert not skipped["continuous"] and not skipped["checks"]["consumed"]
    assert "NOT CONTINUOUS" in continuity.describe(skipped)
    repeated = _record(_facts(5), 5, trained_step=4)  # the loop trained step 5's batch again
    assert not repeated["continuous"] and not repeated["checks"]["first_step"]
    assert "NOT the order's next batch" in continuity.describe(repeated)


def test_changed_data_and_an_edited_order_are_refused_before_launch():
    sampler = continuity.training_sampler(SAMPLES, BATCH, SEED)
    continuity.check_before_launch("ckpt", _facts(5), "d", sampler, BATCH, "x.csv")
    with pytest.raises(ConfigError, match="the training data changed since this checkpoint"):
        continuity.check_before_launch("ckpt", _facts(5), "other", sampler, BATCH, "x.csv")
    with pytest.raises(ConfigError, match="its sample order is not this run's"):
        continuity.check_before_launch(
            "ckpt", {**_facts(5), "order": "0" * 16}, "d", sampler, BATCH, "x.csv"
        )
    other_seed = continuity.training_sampler(SAMPLES, BATCH, SEED + 1)
    with pytest.raises(ConfigError, match="the global batch, seed or data.group_by_length differ"):
        continuity.check_before_launch("ckpt", _facts(5), "d", other_seed, BATCH, "x.csv")


def test_continuity_facts_with_keys_missing_are_refused_before_launch():
    sampler = continuity.training_sampler(SAMPLES, BATCH, SEED)
    facts = {key: value for key, value in _facts(5).items() if key != "consumed"}
    with pytest.raises(ConfigError, match="continuity facts lack consumed"):
        continuity.check_before_launch("ckpt", facts, "d", sampler, BATCH, "x.csv")
