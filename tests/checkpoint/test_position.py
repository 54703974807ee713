"""A mid-epoch checkpoint of a user's own loop resumes after the last batch it trained
(``rankwise.checkpoint.position``): at the same and at another world size, whatever epoch the loop
restarts, with the continuity record; a loop that still skips the steps itself is stopped with the
fix.

The loop is written as users write it: AdamW at its defaults, ``for epoch in range(start, EPOCHS)``
with the epoch saved in ``extra``, no skipping of its own.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import rankwise
from rankwise.errors import ConfigError
from rankwise.measure import tolerance
from tests.support.multiproc import RanksFailed, run_ranks
from tests.support.tiers import starts_processes

SAMPLES, GLOBAL_BATCH, EPOCHS = 600, 12, 2
STEPS_PER_EPOCH = SAMPLES // GLOBAL_BATCH  # 50
TOTAL = EPOCHS * STEPS_PER_EPOCH


def dataset() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(5)
    features = torch.randn(SAMPLES, 20, generator=generator)
    return torch.utils.data.TensorDataset(
        features, (features[:, :4].argmax(1) + (features[:, 5] > 1)) % 4
    )


def own_loop(
    checkpoints: str, phase: str, save_at: int, dropout: float, restart: str = "saved"
) -> dict | None:
    """``phase``: ``full`` (uninterrupted), ``first`` (to ``save_at``, save, stop) or ``resume``.
    ``restart``: the epoch a resumed loop starts at: ``saved`` (load_state's extra), ``zero`` (the
    loop starts over, stopping at ``TOTAL`` steps), ``skip`` (``saved``, plus the skip of done steps
    loops needed before)."""
    with rankwise.setup(seed=0) as rt:
        layers = (
            [nn.Linear(20, 64), nn.ReLU()]
            + ([nn.Dropout(dropout)] if dropout else [])
            + [nn.Linear(64, 4)]
        )
        model = nn.Sequential(*layers)
        model, optimizer = rt.prepare(model, torch.optim.AdamW(model.parameters()))
        loader = rt.loader(dataset(), GLOBAL_BATCH)
        start = 0
        if phase == "resume":
            saved = rt.load_state(checkpoints, model, optimizer)
            start = 0 if restart == "zero" else saved["epoch"]
        for epoch in range(start, EPOCHS * 2 if restart == "zero" else EPOCHS):
            rt.set_epoch(loader, epoch)
            for i, (features, labels) in enumerate(loader):
                if (
                    restart == "skip"
                    and epoch == start
                    and i < saved["step"] - start * STEPS_PER_EPOCH
                ):
                    continue
                features, labels = rt.to_device((features, labels))
                rt.backward(nn.functional.cross_entropy(model(features), labels), model)
                rt.step(optimizer, model)
                rt.zero_grad(optimizer)
                if phase == "first" and rt.steps == save_at:
                    rt.save_state(checkpoints, model, optimizer, extra={"epoch": epoch})
                    return None
                if rt.steps == TOTAL:
                    break
            if rt.steps == TOTAL:
                break
        weights = rt.state_dict(model)
        return (
            {"weights": weights, "steps": rt.steps, "continuity": loader.continuity}
            if rt.is_main
            else None
        )


@pytest.fixture(scope="module")
@starts_processes()
def uninterrupted() -> dict:
    """The 2-rank run without a break, with dropout (bitwise reference) and without (for other world
    sizes)."""
    return {dropout: run_ranks(own_loop, 2, "-", "full", 0, dropout)[0] for dropout in (0.1, 0.0)}


def _max_diff(a: dict, b: dict) -> float:
    return tolerance.max_param_diff(a["weights"], b["weights"])


@pytest.mark.parametrize("save_at", [40, 65])  # in the first epoch, and in the second
def test_a_mid_epoch_resume_at_the_same_world_size_continues_bitwise(
    save_at, uninterrupted, tmp_path
):
    run_ranks(own_loop, 2, str(tmp_path), "first", save_at, 0.1)
    resumed = run_ranks(own_loop, 2, str(tmp_path), "resume", save_at, 0.1)[0]
    assert resumed["steps"] == TOTAL
    assert _max_diff(resumed, uninterrupted[0.1]) == 0.0  # dropout on: the RNG streams continue too
    record = resumed["continuity"]
    assert record["continuous"] and record["epoch"] == save_at // STEPS_PER_EPOCH
    assert (
        record["position"] == save_at % STEPS_PER_EPOCH * GLOBAL_BATCH
        and record["trained"] == GLOBAL_BATCH
    )


# "zero": a loop that starts over at epoch 0 (stopping at its step count) after a save in the second
# epoch.
@pytest.mark.parametrize(("restart", "save_at"), [("saved", 40), ("zero", 65)])
def test_a_mid_epoch_resume_at_three_ranks_ends_with_the_uninterrupted_weights(
    restart, save_at, uninterrupted, tmp_path
):
    run_ranks(own_loop, 2, str(tmp_path), "first", save_at, 0.0)
    resumed = run_ranks(own_loop, 3, str(tmp_path), "resume", save_at, 0.0, restart)[0]
    difference = _max_diff(resumed, uninterrupted[0.0])
    print(
        f"2 ranks to step {save_at}, 3 ranks after it ({restart}): max |w - uninterrupted| = "
        f"{difference:.2e}"
    )
    assert resumed["steps"] == TOTAL and difference < tolerance.EXACT
    record = resumed["continuity"]
    assert (
        record["continuous"]
        and record["written"]["world_size"] == 2
        and record["resumed"]["world_size"] == 3
    )
    assert record["position"] == save_at % STEPS_PER_EPOCH * GLOBAL_BATCH
    assert record["loop_epoch"] == (None if restart == "saved" else 0)


def test_the_resume_prints_its_record_once(tmp_path, capsys):
    # in this process (single): the record goes where the user looks
    own_loop(str(tmp_path), "first", 40, 0.1)
    capsys.readouterr()
    own_loop(str(tmp_path), "resume", 40, 0.1)
    text = capsys.readouterr().out
    assert text.count("continuity: rt.loader resumed epoch 0 at sample 480 of 600") == 1, text
    assert "first step: the ranks trained 12 samples (12 distinct) = the order's next ones" in text
    assert "no sample skipped, none repeated" in text


@pytest.mark.multiproc
def test_a_loop_that_still_skips_the_done_steps_itself_is_stopped_with_the_fix(tmp_path):
    run_ranks(own_loop, 2, str(tmp_path), "first", 40, 0.0)
    with pytest.raises(RanksFailed) as failed:
        run_ranks(own_loop, 2, str(tmp_path), "resume", 40, 0.0, "skip")
    message = str(failed.value)
    # 40 steps done: the loop passes over the 10 batches left in epoch 0 (rt.loader had already
    # skipped 40).
    assert (
        "took 11 batches before its first step, where a step takes 1: it passed over 10 itself"
        in message
    )
    assert "Remove the loop's own skip" in message


def test_another_order_is_refused_at_load(tmp_path):
    own_loop(str(tmp_path), "first", 40, 0.0)
    # the same loop on one global batch fewer samples: another order
    with rankwise.setup(seed=0) as rt:
        model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
        model, optimizer = rt.prepare(model, torch.optim.AdamW(model.parameters()))
        fewer = torch.utils.data.Subset(dataset(), range(SAMPLES - GLOBAL_BATCH))
        loader = rt.loader(fewer, GLOBAL_BATCH)  # noqa: F841
        with pytest.raises(
            ConfigError,
            match=r"rt.loader: the checkpoint stood at sample 480 of epoch 0 in an "
            r"order this run's loader does not have \(epoch_samples, order",
        ):
            rt.load_state(tmp_path, model, optimizer)


def loop_with_validation(checkpoints: str, phase: str) -> list[int]:
    """One epoch with a validation loader of rt.loader's too, evaluated at step 40 (before a save at
    45) and after the epoch; returns the samples each evaluation saw."""
    seen = []
    with rankwise.setup(seed=0) as rt:
        model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
        model, optimizer = rt.prepare(model, torch.optim.AdamW(model.parameters()))
        loader = rt.loader(dataset(), GLOBAL_BATCH)
        validation = rt.loader(dataset(), GLOBAL_BATCH, shuffle=False)
        if phase == "resume":
            rt.load_state(checkpoints, model, optimizer)
        for features, labels in loader:
            features, labels = rt.to_device((features, labels))
            rt.backward(nn.functional.cross_entropy(model(features), labels), model)
            rt.step(optimizer, model)
            rt.zero_grad(optimizer)
            if rt.steps == 40:
                seen.append(sum(len(batch[0]) for batch in validation))
            if phase == "first" and rt.steps == 45:
                rt.save_state(checkpoints, model, optimizer, extra={"epoch": 0})
                return seen
        seen.append(sum(len(batch[0]) for batch in validation))
    return seen


def test_a_loader_whose_pass_had_finished_starts_its_next_pass_whole_after_a_resume(tmp_path):
    # The validation pass at step 40 had finished when the training loader's position was saved at
    # step 45.
    assert loop_with_validation(str(tmp_path), "first") == [SAMPLES]
    assert loop_with_validation(str(tmp_path), "resume") == [SAMPLES]
