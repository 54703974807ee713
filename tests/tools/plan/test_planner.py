"""The planner's choices beyond each row's accounting: which replays a plan needs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rankwise.tools.plan import planner
from rankwise.tools.plan.capture import from_factory
from rankwise.tools.plan.command import make_plan
from rankwise.tools.plan.config import PlanConfig
from rankwise.tools.plan.devices import lookup
from tests.support.tools.plan.accounting_model import ROWS, WIDTH, build


@pytest.fixture(scope="module")
def capture():
    return from_factory(build, (torch.randn(ROWS, WIDTH),))


def test_activation_checkpointing_is_replayed_only_where_it_could_make_a_row_fit(
    capture, monkeypatch, tmp_path
):
    """A row that does not fit is offered activation checkpointing where the states a rank holds
    throughout (parameters, optimizer state) fit: checkpointing drops activations only, so past
    that its replay (18 CPU-s of the 8B plan, for DDP's rows) cannot make the row fit."""
    replays: list[bool] = []

    def recorded(*args, checkpointing: bool = False, **kwargs):
        replays.append(checkpointing)
        return trace(*args, checkpointing=checkpointing, **kwargs)

    trace = planner.trace
    monkeypatch.setattr(planner, "trace", recorded)
    (tmp_path / "train.py").write_text("")  # (the capture is given: the file is never read)
    config = PlanConfig(
        script=tmp_path / "train.py",
        nproc_per_node=[2],
        strategies=["ddp"],
        device="h100",
        micro_batch=ROWS,
    )
    [roomy] = make_plan(config, capture).rows
    states = roomy.memory.parameters + roomy.memory.optimizer
    assert replays == [False] and roomy.fits
    memory = lookup("h100", 2).memory_bytes

    def plan_with_room(limit: int) -> planner.Row:
        replays.clear()
        [row] = make_plan(dataclasses.replace(config, headroom=1 - limit / memory), capture).rows
        return row

    # the states fit, the step does not: checkpointing is tried
    tight = plan_with_room(states + 1024)
    assert not tight.fits and replays.count(True) == 1
    # the states alone are over: no replay with checkpointing
    over = plan_with_room(states - 1024)
    assert not over.fits and True not in replays  # (bf16 is still tried: other states)
    assert "activation checkpointing" not in over.change
