"""The optimizer's settings compared exactly, and the causes their differences are named as:
Accelerate's per-process scheduler stepping, a rate scaled by the world size, another beta."""

from __future__ import annotations

from pathlib import Path

from rankwise.tools.verify.compare import TracedRun
from rankwise.tools.verify.diagnose import diagnose
from rankwise.tools.verify.hyperparameter_diff import changes_training, differences, same

GROUP = {"lr": 0.0, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}


def _scheduler(epoch: int, lr: float) -> dict:
    return {
        "scheduler": "LambdaLR",
        "base_lrs": [2e-5],
        "last_epoch": epoch,
        "_step_count": epoch + 1,
        "_last_lr": [lr],
    }


def _run(steps: list[tuple[int, float]], **group) -> TracedRun:
    """One record per step: the scheduler's last_epoch and the rate before it."""
    return TracedRun(
        Path("."),
        records={
            step: [
                {
                    "samples": ["a"],
                    "tokens": [],
                    "losses": [0.5],
                    "random_draws": 0,
                    "no_grad": [],
                    "learning_rates": [lr],
                    "hyperparameters": [GROUP | {"lr": lr} | group],
                    "schedulers": [_scheduler(epoch, lr)],
                }
            ]
            for step, (epoch, lr) in enumerate(steps, 1)
        },
    )


def _line(reference: TracedRun, candidate: TracedRun, step: int) -> dict:
    found = differences(reference.records[step][0], candidate.records[step][0])
    return {
        "step": step,
        "data": "same",
        "loss_ok": True,
        "top": [("w", 2e-7)],
        "max_param_diff": 2e-7,
        "loss_reference": 0.5,
        "loss_candidate": 0.5,
        "followed": True,
        "gradient_ok": True,
        "gradient_diff": 1e-7,
        "gradient_top": [("w", 1e-7)],
        "gradient_scale": 1.0,
        "gradient_only_one": [],
        "update_diff": 1.0,
        "update_top": [("w", 1.0)],
        "settings_diffs": found,
        "settings_ok": not changes_training(found),
        "equivalent": False,
    }


# nlp_example's warm-up (2e-5 over 100 steps): one process steps it once per optimizer step, 2 ranks
# under Accelerate twice
ONE = _run([(0, 0.0), (1, 2e-7), (2, 4e-7)])
TWO = _run([(0, 0.0), (2, 4e-7), (4, 8e-7)])


def test_accelerates_scheduler_stepped_per_process_is_named_with_its_fixes():
    line = _line(ONE, TWO, 2)
    kinds = {d["kind"] for d in line["settings_diffs"]}
    assert kinds == {"scheduler", "learning-rate"} and not line["settings_ok"]
    found = diagnose(
        ONE, TWO, [line], line, strategy="accelerate script", world_size=2, framework="accelerate"
    )
    assert [cause["kind"] for cause in found] == ["scheduler"]
    causes = [cause["text"] for cause in found]
    assert causes[0].startswith(
        "the learning-rate scheduler did not step as in one process before step 2 (scheduler 0 "
        "(LambdaLR) last_epoch: one process 1, 2 ranks 2"
    ), causes
    assert "group 0 lr: one process 2e-07, 2 ranks 4e-07" in causes[0]
    assert "stepped 2 times per optimizer step on the 2 ranks and 1 in one process" in causes[0]
    for fix in (
        "multiplied by accelerator.num_processes",
        "Accelerator(step_scheduler_with_optimizer=False)",
        "Accelerator(split_batches=True)",
    ):
        assert fix in causes[0]
    assert len(causes) == 1  # (the rate it set is the scheduler's cause, not a second one)
    # the same evidence in a plain script: no Accelerate to blame
    plain = diagnose(ONE, TWO, [line], line, strategy="torch script", world_size=2)[0]["text"]
    assert "AcceleratedScheduler" not in plain and "once per optimizer step" in plain


def test_a_scheduler_ahead_with_the_same_rates_is_not_a_difference():
    """Accelerate's documented fix keeps stepping the scheduler twice, over twice the steps: the
    rates are one process's, the position is not."""
    fixed = _run([(0, 0.0), (2, 2e-7), (4, 4e-7)])
    line = _line(ONE, fixed, 2)
    assert [d["key"] for d in line["settings_diffs"]] == ["last_epoch", "_step_count"]
    assert line["settings_ok"]


def test_a_rate_scaled_by_the_world_size_and_another_beta_are_each_named():
    scaled = _run([(0, 0.0), (1, 4e-7), (2, 8e-7)], betas=[0.9, 0.99])
    line = _line(ONE, scaled, 2)
    found = diagnose(ONE, scaled, [line], line, strategy="ddp", world_size=2)
    assert [cause["kind"] for cause in found] == ["learning-rate", "hyperparameters"]
    causes = [cause["text"] for cause in found]
    assert causes[0].startswith(
        "the optimizer's learning rate differs at step 2: one process 2e-07, 2 ranks 4e-07: 2x, "
        "the script scales it by the world size (group 0 lr: one process 2e-07, 2 ranks 4e-07; "
        "scheduler 0 (LambdaLR) _last_lr: one process 2e-07, 2 ranks 4e-07)"
    ), causes
    assert causes[1].startswith(
        "the optimizer's hyper-parameters differ at step 2 (group 0 betas: one process [0.9, "
        "0.999], 2 ranks [0.9, 0.99])"
    ), causes


def test_values_are_equal_only_exactly():
    assert same(2, 2.0) and same([0.9, 0.999], [0.9, 0.999]) and same(float("nan"), float("nan"))
    assert not same(True, 1) and not same(2e-7, 2e-7 * (1 + 1e-15)) and not same(None, 0.0)
