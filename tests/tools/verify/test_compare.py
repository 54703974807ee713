"""verify's per-step comparison on traced runs written by hand: each tensor's update against one
process's, relative to its size; the optimizer's settings exactly."""

from __future__ import annotations

from pathlib import Path

import torch

from rankwise.checkpoint import write_weights
from rankwise.measure.tolerance import EXACT
from rankwise.tools.step_trace import weights_file
from rankwise.tools.verify.compare import TracedRun, compare

GROUP = {"lr": 2e-7, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01, "foreach": None}


def _record(**changes) -> dict:
    return {
        "samples": ["a"],
        "tokens": [],
        "losses": [0.5],
        "random_draws": 0,
        "no_grad": [],
        "followed": True,
        "learning_rates": [2e-7],
        "hyperparameters": [GROUP],
        "schedulers": [],
    } | changes


def _run(directory: Path, weights: list[dict[str, torch.Tensor]], records: list[dict]) -> TracedRun:
    for step, tensors in enumerate(weights):
        write_weights(tensors, weights_file(directory, step))
    return TracedRun(directory, records={step: [r] for step, r in enumerate(records, 1)})


def _start() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"w": torch.randn(32, 16) * 0.02, "norm": torch.ones(32)}


def _stepped(start: dict[str, torch.Tensor], lr: float) -> dict[str, torch.Tensor]:
    """A step of Adam's size: every element moved by about ``lr``."""
    torch.manual_seed(1)
    return {name: t - lr * torch.sign(torch.randn_like(t)) for name, t in start.items()}


def test_a_learning_rate_twice_one_processs_is_caught_by_the_update_where_the_weights_pass(
    tmp_path,
):
    """lr 4e-7 against 2e-7 (Accelerate's warm-up at 2 ranks), the step's settings recorded alike
    (a rate the optimizer's groups do not show): the weights part by ~2e-7, under the old 1e-5, and
    the update by 100 %."""
    start = _start()
    reference = _run(tmp_path / "one", [start, _stepped(start, 2e-7)], [_record()])
    candidate = _run(tmp_path / "many", [start, _stepped(start, 4e-7)], [_record()])
    lines = compare(reference, candidate, EXACT, 5e-5)
    step = lines[1]
    assert step["max_param_diff"] < EXACT  # what the old criterion passed
    assert step["update_diff"] is not None and step["update_diff"] > 0.4
    assert not step["update_ok"] and not step["equivalent"] and step["settings_ok"]
    # (the LayerNorm weights of 1.0, whose unit in the last place is 1.2e-7, are rounded to whole
    # units: still caught)
    assert dict(step["update_top"])["norm"] > 0.1


def test_the_same_update_one_unit_in_the_last_place_apart_is_equivalent(tmp_path):
    start = _start()
    after = _stepped(start, 2e-7)
    rounded = {name: torch.nextafter(t, t + 1) for name, t in after.items()}
    reference = _run(tmp_path / "one", [start, after], [_record()])
    candidate = _run(tmp_path / "many", [start, rounded], [_record()])
    step = compare(reference, candidate, EXACT, 5e-5)[1]
    assert step["update_diff"] == 0.0 and step["equivalent"], step


def test_another_learning_rate_in_the_groups_differs_exactly_even_where_the_update_agrees(
    tmp_path,
):
    """lr x (1 + 1e-9): below any update tolerance, but not the same setting."""
    start = _start()
    after = _stepped(start, 2e-7)
    other = _record(hyperparameters=[GROUP | {"lr": 2e-7 * (1 + 1e-9)}])
    reference = _run(tmp_path / "one", [start, after], [_record()])
    candidate = _run(tmp_path / "many", [start, after], [other])
    step = compare(reference, candidate, EXACT, 5e-5)[1]
    assert step["update_ok"] and not step["settings_ok"] and not step["equivalent"]
    assert step["settings_diffs"] == [
        {
            "where": "group 0",
            "key": "lr",
            "one": 2e-7,
            "many": 2e-7 * (1 + 1e-9),
            "kind": "learning-rate",
        }
    ]
    # a kernel choice is not a hyper-parameter
    fused = _record(hyperparameters=[GROUP | {"foreach": True}])
    candidate = _run(tmp_path / "fused", [start, after], [fused])
    assert compare(reference, candidate, EXACT, 5e-5)[1]["equivalent"]


def test_batches_a_script_makes_itself_are_compared_by_the_model_inputs():
    """No DataLoader: the ranks' training inputs against the one process's.  The same rows are the
    same data; other rows (a generator seeded per rank, nanoGPT) make the step not comparable
    ("made"); the same rows on every rank are the unsharded defect ("differs")."""
    from rankwise.tools.verify.compare import compare_samples

    def step(samples=(), inputs=()):
        return _record(samples=list(samples), inputs=list(inputs))

    assert compare_samples([step()], [step(), step()])[0] == "unseen"
    assert compare_samples([step(inputs="abcd")], [step(inputs="ab"), step(inputs="cd")]) == (
        "same",
        "",
    )
    status, detail = compare_samples([step(inputs="abcd")], [step(inputs="ab"), step(inputs="xy")])
    assert status == "made" and "2 of their 4 rows" in detail and "no DataLoader" in detail
    assert compare_samples([step(inputs="ab")], [step(inputs="ab"), step(inputs="ab")])[0] == (
        "differs"
    )
    # (a DataLoader's samples, where there are any, are what the step is compared by)
    assert compare_samples([step("ab", "zz")], [step("a", "x"), step("b", "y")])[0] == "same"


def test_a_step_on_batches_the_runs_made_otherwise_is_not_equivalent(tmp_path):
    start = _start()
    after = {name: t - 1e-3 for name, t in start.items()}
    one = _run(tmp_path / "one", [start, after], [_record(samples=[], inputs=["a", "b"])])
    many = _run(tmp_path / "many", [start, after], [_record(samples=[], inputs=["c", "d"])])
    (_, line) = compare(one, many, EXACT)
    assert line["data"] == "made" and not line["equivalent"]
