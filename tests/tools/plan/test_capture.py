"""rankwise plan's capture: a script's first training step, its model built with fake parameters."""

from __future__ import annotations

import pytest
import torch

from rankwise.errors import ConfigError
from rankwise.measure.memory import peak_rss_megabytes
from rankwise.tools.plan.capture import from_script
from rankwise.tools.plan.fake import is_fake
from rankwise.tools.plan.fake_step import trace
from tests.support.cli import ROOT

PLAIN = ROOT / "tests/support/tools/plan/plain_script.py"


def test_a_script_on_rankwise_setup_is_captured_with_its_loop_facts():
    capture = from_script(ROOT / "examples/causal_lm.py", ["--out", "unused", "--length", "24"])
    assert type(capture.model).__name__ == "GPT2LMHeadModel"
    assert all(is_fake(p) for p in capture.model.parameters())
    # rt.prepare's, rt.loader's
    assert (capture.grad_accum, capture.global_batch, capture.rows) == (2, 16, 16)
    assert capture.autocast  # the forward runs under rt.autocast()
    assert capture.kwargs["input_ids"].shape == (16, 24) and not is_fake(
        capture.kwargs["input_ids"]
    )
    assert "causal_lm.py --out unused --length 24" in capture.source


def test_a_plain_torch_script_is_captured_at_its_first_training_forward():
    capture = from_script(PLAIN, ["--batch-size", "12"])
    assert isinstance(capture.optimizer, torch.optim.SGD) and capture.global_batch is None
    assert capture.rows == 12 and capture.grad_accum == 1 and not capture.autocast
    measured = trace(capture, 12)
    assert measured.numel == 32 * 256 + 256 + 256 * 4 + 4
    assert measured.optimizer_moments == 1  # SGD's momentum buffer


@pytest.mark.parametrize("script", ["tutorial_ddp.py", "spawn_ddp.py"])
def test_a_script_that_starts_its_own_ddp_job_is_captured_as_one_rank(script):
    """PyTorch's DDP tutorial (torchrun's variables, env:// rendezvous, ``DDP(model)``) and the
    documents' mp.spawn script (two ranks asked for in code): one rank here, the model as the script
    built it, nothing left behind."""
    import os

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    capture = from_script(ROOT / "tests/support/tools/watch/scripts" / script, [])
    assert (
        not isinstance(capture.model, DistributedDataParallel)
        and type(capture.model).__name__ != "StandAside"
    )
    assert all(is_fake(p) for p in capture.model.parameters()) and capture.rows > 0
    assert not dist.is_initialized() and "RANK" not in os.environ  # the one-rank world is gone
    # and the wrapper put back
    assert torch.nn.parallel.DistributedDataParallel is DistributedDataParallel


def test_a_script_that_reads_a_loss_before_training_is_captured():
    """nanoGPT evaluates (``estimate_loss``: ``loss.item()``) before its first step: a fake
    tensor's value reads 0 there, instead of the DataDependentOutputException that stopped it."""
    capture = from_script(PLAIN, ["--evaluate-first", "--batch-size", "8"])
    assert capture.rows == 8 and all(is_fake(p) for p in capture.model.parameters())
    assert torch.tensor(2.5).item() == 2.5  # (a real tensor's read put back after the capture)


def test_a_script_that_never_trains_is_a_clear_error():
    with pytest.raises(ConfigError, match="ended without a training step"):
        from_script(PLAIN, ["--never-train"])
    with pytest.raises(ConfigError, match="no such script"):
        from_script(ROOT / "missing.py", [])


def test_an_8b_model_is_captured_without_allocating_it():
    before = peak_rss_megabytes()
    capture = from_script(
        ROOT / "examples/llama_pretrain.py", ["--size", "8b", "--length", "128", "--samples", "32"]
    )
    assert sum(p.numel() for p in capture.model.parameters()) == pytest.approx(8.03e9, rel=0.001)
    assert peak_rss_megabytes() - before < 1024  # its 32 GB of fp32 parameters were never touched
