"""Issue 24's speed features on a CUDA GPU: torch.compile and activation checkpointing over NCCL
against the eager `single` run, and FLOP/s and MFU against the measured and the datasheet peak.
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from rankwise.checkpoint import read_weights
from rankwise.measure.flops import datasheet_peak
from rankwise.measure.tolerance import tolerance
from tests.support.gpu import max_difference, train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (on a GPU machine: make gpu-check)"
    ),
]


@pytest.fixture(scope="module")
def eager(tmp_path_factory):
    out = tmp_path_factory.mktemp("eager-single")
    train(
        out, tmp_path_factory.mktemp("cache"), "--strategy", "single", "--set", "model.dropout=0.0"
    )
    return read_weights(out / "checkpoints")


@pytest.mark.parametrize(
    "strategy,setting",
    [
        ("single", "compile=true"),
        ("ddp", "compile=true"),
        ("fsdp", "compile=true"),
        ("ddp", "model.activation_checkpointing=true"),
        ("fsdp", "model.activation_checkpointing=true"),
        ("deepspeed-zero3", "model.activation_checkpointing=true"),
    ],
)
def test_compiled_and_checkpointed_runs_train_like_eager_single(strategy, setting, eager, tmp_path):
    nproc = [] if strategy == "single" else ["--nproc-per-node", "1"]
    summary = train(
        tmp_path,
        tmp_path / "cache",
        "--strategy",
        strategy,
        *nproc,
        "--set",
        "model.dropout=0.0",
        "--set",
        setting,
    )
    assert summary["device"] == "cuda:0"
    difference = max_difference(eager, read_weights(tmp_path / "checkpoints"))
    print(f"{strategy} with {setting}: max |eager single - it| = {difference:.2e}")
    assert difference <= tolerance("32-true")


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_mfu_against_the_measured_and_the_datasheet_peak(precision, tmp_path):
    summary = train(
        tmp_path,
        tmp_path / "cache",
        "--strategy",
        "single",
        "--precision",
        precision,
        "--set",
        "throughput_warmup_steps=2",
    )
    print({k: summary[k] for k in ("tflops_per_s", "peak_tflops_per_s", "mfu", "mfu_datasheet")})
    # a GPU: more than 1 TFLOP/s
    assert summary["tflops_per_s"] > 0 and summary["peak_tflops_per_s"] > 1.0
    assert 0 < summary["mfu"] < 1.5
    dtype = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16}[precision]
    if datasheet_peak(torch.device("cuda", 0), dtype):  # a known GPU (H100, A100, ...)
        assert 0 < summary["mfu_datasheet"] < summary["mfu"] * 5
