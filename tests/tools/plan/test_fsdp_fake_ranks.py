"""FSDP measured once on fake ranks and scaled to the plan's other world sizes
(``fsdp_fake_ranks.at_world``): against a measurement at each of them, on the accounting model."""

from __future__ import annotations

import pytest
import torch

from rankwise.tools.plan import planner
from rankwise.tools.plan.capture import from_factory
from rankwise.tools.plan.command import make_plan
from rankwise.tools.plan.config import PlanConfig
from rankwise.tools.plan.fsdp_fake_ranks import at_world, fsdp
from tests.support.tools.plan.accounting_model import ROWS, WIDTH, build


@pytest.fixture(scope="module")
def capture():
    return from_factory(build, (torch.randn(ROWS, WIDTH),), autocast=True)


@pytest.fixture(scope="module")
def at_two(capture):
    return fsdp(capture, ROWS, 2, autocast=torch.bfloat16, gloo=True)


@pytest.mark.parametrize("world", [5, 64])
def test_fsdp_at_another_world_size_from_one_measurement(capture, at_two, world):
    measured = fsdp(capture, ROWS, world, autocast=torch.bfloat16, gloo=True)
    shapes = [p.shape for p in capture.model.parameters()]
    scaled = at_world(at_two, 2, world, shapes)
    # the shards a rank keeps, and its optimizer state (moments and step counts): to the byte
    assert (scaled.parameters, scaled.gradients) == (measured.parameters, measured.gradients)
    assert scaled.optimizer == measured.optimizer
    assert scaled.at_peak["activations"] == measured.at_peak["activations"]
    # the rest is padding: 64 ranks pad the 10-row head to 64 (measured: +0.37 % at 5, +1.6 % at 64)
    assert scaled.peak == pytest.approx(measured.peak, rel=0.02)
    assert "from the measurement at 2" in scaled.source


def test_a_plan_measures_fsdp_once_for_its_world_sizes(capture, monkeypatch, tmp_path):
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[2])
        return fsdp(*args, **kwargs)

    monkeypatch.setattr(planner, "fsdp", counted)
    (tmp_path / "train.py").write_text("")
    config = PlanConfig(
        script=tmp_path / "train.py",  # (the capture is given: the file is never read)
        nproc_per_node=[2, 4, 8],
        strategies=["fsdp"],
        precision="bf16-mixed",
        device="h100",
        micro_batch=ROWS,
    )
    plan = make_plan(config, capture)
    assert calls == [2]  # the smallest world size measured, the others scaled from it
    rows = {row.world_size: row for row in plan.rows}
    assert rows[2].memory.source.startswith("measured")
    assert "from the measurement at 2" in rows[8].memory.source
    assert rows[8].memory.parameters < rows[4].memory.parameters < rows[2].memory.parameters
