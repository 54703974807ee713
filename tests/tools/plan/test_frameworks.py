"""rankwise plan captures and replays scripts written for the frameworks: Accelerate's
``Accelerator(cpu=True)`` and a Lightning ``Trainer(strategy="ddp", devices=2)``."""

from __future__ import annotations

import pytest
import torch

from rankwise.tools.plan.capture import from_script
from rankwise.tools.plan.fake import is_fake
from rankwise.tools.plan.steps import TrainingStep
from rankwise.tools.plan.trace import trace
from tests.support.cli import ROOT

ACCELERATE_CPU = ROOT / "tests/support/tools/plan/accelerate_cpu.py"
LIGHTNING = ROOT / "tests/support/tools/watch/scripts/lightning_trainer.py"
MLP = 16 * 32 + 32 + 32 * 2 + 2


def _same_objects(capture) -> bool:
    trained = [p for group in capture.optimizer.param_groups for p in group["params"]]
    return {id(p) for p in trained} == {id(p) for p in capture.model.parameters()}


def test_an_accelerate_cpu_script_is_planned():
    """Was: under the capture's torchrun variables Accelerate's CPU device is ``cpu:0``, a fake
    parameter moved there kept the index (a real CPU tensor never has one), and the replay ended in
    ~100 lines of FakeTensorDeviceMismatchError ("cpu:0 and cpu"); before that, a KeyError: prepare
    moved the model after the optimizer was built."""
    capture = from_script(ACCELERATE_CPU, [])
    assert _same_objects(capture)
    assert {p.device for p in capture.model.parameters()} == {torch.device("cpu")}
    measured = trace(capture, 8)
    assert measured.numel == MLP and measured.optimizer_moments == 2


def test_a_lightning_ddp_trainer_script_is_planned():
    """Was: ``'StandAside' object has no attribute 'static_graph'`` (Lightning's DDP teardown reads
    it), after the whole fit had run: Lightning trains through ``training_step``, which the capture
    did not watch, with its DDP wrapper in eval mode.  Lightning is imported first, as in a process
    that has used it before: its strategy holds its own reference to DistributedDataParallel."""
    import lightning.pytorch.strategies.ddp as lightning_ddp
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    capture = from_script(LIGHTNING, ["--epochs", "1"])
    assert isinstance(capture.model, TrainingStep) and _same_objects(capture)
    assert all(is_fake(p) for p in capture.model.parameters())
    assert capture.rows == 8  # one rank's batch of the train loader's (batch, batch_idx)
    with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):
        _ = capture.model.module.trainer  # detached: a copy of the model does not copy the trainer
    measured = trace(capture, 16)
    assert measured.numel == MLP and measured.rows == 16
    assert not dist.is_initialized()
    assert lightning_ddp.DistributedDataParallel is DistributedDataParallel  # put back
