"""rankwise plan's fake parameters keep their objects through device and dtype moves, as torch's own
``Module._apply`` keeps real ones: an optimizer built before ``model.to(...)`` still steps the
model's parameters, on the CPU and (with a CUDA build's fake tensors stood in for) on a GPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rankwise import cli
from rankwise.tools.plan.capture import from_script
from rankwise.tools.plan.fake import FakeParameters, fake_copy, fake_mode, is_fake
from rankwise.tools.plan.fake_step import trace
from tests.support.cli import ROOT
from tests.support.tools.plan.fake_cuda import fake_cuda

MOVED = ROOT / "tests/support/tools/plan/moved_after_optimizer.py"
DTYPES = {"to-device-dtype": torch.bfloat16, "to-dtype": torch.bfloat16, "half": torch.float16}


def _same_objects(capture) -> bool:
    trained = [p for group in capture.optimizer.param_groups for p in group["params"]]
    return [id(p) for p in trained] == [id(p) for p in capture.model.parameters()]


@pytest.mark.parametrize(("move", "dtype"), DTYPES.items())
def test_a_model_cast_after_its_optimizer_is_planned(move, dtype):
    """Was: KeyError in ``rebuilt_optimizer`` (the cast made new parameters the optimizer did not
    hold)."""
    capture = from_script(MOVED, ["--move", move])
    assert _same_objects(capture)
    assert {p.dtype for p in capture.model.parameters()} == {dtype}
    measured = trace(capture, 8)
    assert measured.numel == 16 * 64 + 64 + 64 * 4 + 4
    assert measured.param_dtype == str(dtype).removeprefix("torch.")
    assert measured.optimizer_moments == 2  # AdamW's, over the model's parameters


@pytest.mark.parametrize("move", ["to-device", "cuda", "to-device-dtype"])
def test_a_model_moved_to_the_gpu_after_its_optimizer_is_captured_on_the_cpu(move):
    """Every CUDA script on a GPU machine (``rt.prepare`` moves the model after the optimizer is
    built): was the same KeyError.  A CUDA build's ``.to("cuda")`` of a fake tensor is stood in for
    (``fake_cuda``); the capture holds the same parameter objects, moved to the CPU the plan
    replays on."""
    with fake_cuda():
        capture = from_script(MOVED, ["--move", move, "--device", "cuda"])
    assert _same_objects(capture)
    assert {p.device.type for p in capture.model.parameters()} == {"cpu"}
    assert all(is_fake(p) for p in capture.model.parameters())
    assert trace(capture, 8).numel == 16 * 64 + 64 + 64 * 4 + 4


def test_a_gpu_script_plans_end_to_end(tmp_path, capsys):
    out = tmp_path / "plan"
    with fake_cuda():
        status = cli.main(
            [
                "plan",
                str(MOVED),
                "--device",
                "h100",
                "--strategies",
                "ddp,fsdp",
                "--out",
                str(out),
                "--",
                "--move",
                "to-device-dtype",
                "--device",
                "cuda",
            ]
        )
    assert status == 0, capsys.readouterr().err
    assert (out / "plan.json").is_file()


def test_a_fake_parameter_keeps_its_object_and_gradient_through_a_move():
    with FakeParameters(fake_mode()):
        model = nn.Linear(4, 3)
        optimizer = torch.optim.AdamW(model.parameters())
        weight = model.weight
        model.to(torch.bfloat16)
        model.weight.grad = torch.empty_like(model.weight)
        model.double()
    assert model.weight is weight and optimizer.param_groups[0]["params"][0] is weight
    assert weight.dtype == torch.float64 and weight.grad is not None
    assert weight.grad.dtype == torch.float64 and weight.is_leaf and weight.requires_grad
    copied, rebuilt = fake_copy(model, optimizer)
    assert rebuilt is not None
    assert [p.dtype for p in rebuilt.param_groups[0]["params"]] == [torch.float64] * 2


@pytest.mark.parametrize("adam_w_mode", [True, False])
def test_deepspeeds_fused_adam_is_stepped_as_torchs_adam_on_fake_tensors(adam_w_mode):
    """DeepSpeedExamples' CIFAR-10 script names Adam in its config and DeepSpeed builds its
    FusedAdam, whose compiled kernel given fake tensors (no memory) crashed the plan with a
    segfault. Its copy steps as torch's AdamW (adam_w_mode, DeepSpeed's default) or Adam, with the
    groups' settings. (The instance is made without FusedAdam's __init__, which compiles the
    kernel.)"""
    from deepspeed.ops.adam import FusedAdam

    with FakeParameters(fake_mode()):
        model = nn.Linear(4, 2)
    fused = object.__new__(FusedAdam)
    fused.param_groups = [{"params": list(model.parameters()), "lr": 0.1, "weight_decay": 0.01}]
    fused.defaults = {"lr": 0.1, "weight_decay": 0.01}
    fused.adam_w_mode = adam_w_mode
    copy, optimizer = fake_copy(model, fused)
    assert type(optimizer) is (torch.optim.AdamW if adam_w_mode else torch.optim.Adam)
    assert optimizer.param_groups[0]["lr"] == 0.1
    assert {id(p) for p in optimizer.param_groups[0]["params"]} == {
        id(p) for p in copy.parameters()
    }
    copy(torch.ones(3, 4)).sum().backward()
    optimizer.step()  # (on fake tensors: shapes only)
    assert {len(state) for state in optimizer.state.values()} == {3}  # step, two moments
