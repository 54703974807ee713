"""rankwise plan captures and replays scripts written for the frameworks: Accelerate's
``Accelerator(cpu=True)`` and a Lightning ``Trainer(strategy="ddp", devices=2)``."""

from __future__ import annotations

import json

import pytest
import torch

from rankwise.tools.plan.capture import from_script
from rankwise.tools.plan.fake import is_fake
from rankwise.tools.plan.fake_step import trace
from rankwise.tools.plan.lightning_steps import TrainingStep
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


FSDP2 = ROOT / "tests/support/tools/plan/fsdp2_meta.py"
DEEPSPEED = ROOT / "tests/support/tools/plan/deepspeed_engine.py"


def test_an_fsdp2_script_built_on_the_meta_device_is_planned():
    """PyTorch's FSDP2 example, in small. Was: ``AssertionError`` at the script's own
    ``isinstance(model, FSDPModule)`` (the capture's ``fully_shard`` returned the module as it was),
    then ``set_data``'s "incompatible tensor type" at ``to_empty`` (a fake parameter moved off the
    meta device)."""
    from torch.distributed.fsdp import FSDPModule

    capture = from_script(FSDP2, [])
    assert type(capture.model).__name__ == "Model" and _same_objects(capture)
    # the one-rank FSDP classes and the parameters' DTensor answers are gone with the capture
    assert not any(isinstance(module, FSDPModule) for module in capture.model.modules())
    assert all(
        is_fake(p) and p.device == torch.device("cpu") and "placements" not in p.__dict__
        for p in capture.model.parameters()
    )
    measured = trace(capture, 8)
    assert measured.numel == 64 * 16 + 3 * (2 * 16 + 16 * 64 + 64 + 64 * 16 + 16) + 16 * 64
    assert measured.optimizer_moments == 2


@pytest.mark.multiproc  # (the plan times ZeRO-2's real step here)
def test_a_deepspeed_script_with_its_optimizer_in_the_config_is_planned(tmp_path):
    """DeepSpeedExamples' CIFAR-10 script, in small. Was: ``cannot pickle ProcessGroup`` (the
    model copied was the engine), then ``KeyError`` (ZeRO-2 hands its optimizer flat partitions in
    place of the model's parameters), and "Group ... is not registered" (DeepSpeed kept the
    script's destroyed groups for the plan's own ZeRO step, timed here).  The script's
    init_distributed compiles no shared-memory kernel (1-2 minutes on a new virtualenv)."""
    from rankwise import cli

    argv = ["plan", str(DEEPSPEED), "--nproc-per-node", "1", "--out", str(tmp_path), "--json"]
    assert cli.main([*argv, "--strategies", "single,deepspeed-zero2"]) == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["model"]["parameters"] == MLP
    rows = {row["strategy"]: row for row in plan["rows"]}
    assert set(rows) == {"single", "deepspeed-zero2"}
    assert all(row["time"]["total_s"] > 0 for row in rows.values())
    # the optimizer planned is Adam's two moments (and a step count for each parameter)
    memory = rows["single"]["memory"]
    assert 0 <= memory["optimizer"] - 2 * memory["parameters"] <= 8 * 4
