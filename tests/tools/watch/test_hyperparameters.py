"""What the watcher records before each optimizer step: every group's scalar settings and the state
of every scheduler that drives the optimizer, found through a framework's wrapper."""

from __future__ import annotations

import pytest
import torch
from torch.optim import lr_scheduler

from rankwise.tools.watch import hyperparameters


class Wrapper(torch.optim.Optimizer):
    """A framework's optimizer around torch's (as Accelerate's AcceleratedOptimizer is)."""

    def __init__(self, optimizer):  # (not torch's: the wrapped optimizer holds the state)
        self.optimizer = optimizer

    @property
    def param_groups(self):  # type: ignore[override]
        return self.optimizer.param_groups

    def step(self, closure=None):  # type: ignore[override]
        return self.optimizer.step(closure)


@pytest.fixture
def registering():
    """The schedulers built in the test registered, torch's classes restored after it."""
    originals = {
        owner: owner.__dict__["__init__"]
        for owner in (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau)
    }
    hyperparameters.install()
    try:
        yield
    finally:
        for owner, init in originals.items():
            owner.__init__ = init


def test_every_groups_settings_and_every_scheduler_driving_the_optimizer_are_recorded(registering):
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(
        [{"params": [model.weight]}, {"params": [model.bias], "weight_decay": 0.0}], lr=2e-5
    )
    # built on the wrapper, as a scheduler made after accelerator.prepare is
    wrapper = Wrapper(optimizer)
    warmup = lr_scheduler.LambdaLR(wrapper, lambda step: step / 100)
    plateau = lr_scheduler.ReduceLROnPlateau(optimizer)
    lr_scheduler.LambdaLR(torch.optim.SGD(model.parameters(), lr=0.1), lambda step: 1.0)  # another
    wrapper.step()  # (no gradient: nothing moves)
    warmup.step()
    groups = hyperparameters.hyperparameters(optimizer)
    assert groups[0] | {"lr": None} == {
        "lr": None,
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "weight_decay": 0.01,
        "amsgrad": False,
        "maximize": False,
        "foreach": None,
        "capturable": False,
        "differentiable": False,
        "fused": None,
        "decoupled_weight_decay": True,
        "initial_lr": 2e-5,
    }
    assert groups[0]["lr"] == pytest.approx(2e-7) and groups[1]["weight_decay"] == 0.0
    found = hyperparameters.schedulers(optimizer)
    assert [s["scheduler"] for s in found] == ["LambdaLR", "ReduceLROnPlateau"]
    assert found[0]["last_epoch"] == 1 and found[0]["_step_count"] == 2
    assert found[0]["base_lrs"] == [2e-5, 2e-5]
    assert found[1]["patience"] == 10 and found[1]["best"] == float("inf")
    del warmup, plateau
