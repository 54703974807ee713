"""FLOPs counted by torch's counter on a fake copy; the length fit; the measured peak."""

from collections import Counter

import pytest
import torch
from torch import nn

from rankwise.measure.flops import (
    FlopCounter,
    LengthFlops,
    datasheet_peak,
    devices,
    matmul_peak,
    with_length,
)
from rankwise.models.bert import build_bert
from rankwise.train.evaluate import forward_logits


def test_a_linear_layer_counts_its_forward_and_weight_gradient_and_leaves_the_model_alone():
    model = nn.Linear(20, 5)
    counter = FlopCounter(model, lambda m, batch: m(batch["features"]))
    flops = counter.count({"features": torch.randn(8, 20)})
    # forward x @ W^T, and the weight gradient (inputs need none)
    assert flops == 2 * 8 * 20 * 5 * 2
    assert model.weight.grad is None and model.weight.device.type == "cpu"


def test_dropout_draws_nothing_from_the_real_generator():
    model = nn.Sequential(nn.Linear(20, 20), nn.Dropout(0.5), nn.Linear(20, 2))
    counter = FlopCounter(model, lambda m, batch: m(batch["features"]))
    batch = {"features": torch.zeros(4, 20)}
    before = torch.get_rng_state()
    counter.count(batch)
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_the_length_fit_equals_counting_every_length(pooling):
    torch.manual_seed(0)
    model, _ = build_bert(
        "tiny", num_labels=3, dropout=0.1, vocab_size=200, pad_id=0, max_length=96, pooling=pooling
    )
    template = {
        "input_ids": torch.ones(4, 10, dtype=torch.long),
        "attention_mask": torch.ones(4, 10, dtype=torch.long),
        "labels": torch.zeros(4, dtype=torch.long),
        "index": torch.arange(4),
    }
    counter = FlopCounter(model, forward_logits)
    shapes = Counter({(4, n): 1 + n % 3 for n in (7, 12, 20, 33, 41, 64, 96)} | {(3, 50): 2})
    fitted = LengthFlops(counter, template)
    total = fitted.total(shapes)
    assert fitted.fitted is not None  # the fit was used, once a fourth length confirmed it
    each = sum(
        counter.count(with_length(template, n, rows)) * times for (rows, n), times in shapes.items()
    )
    assert abs(total - each) <= 1e-9 * each
    # Attention grows with the square of the length: twice the length costs more than twice the
    # FLOPs.
    assert counter.count(with_length(template, 64, 4)) > 2 * counter.count(
        with_length(template, 32, 4)
    )


def test_a_rank_computing_on_several_devices_counts_them():
    assert devices(nn.Linear(2, 2)) == 1
    # without GPUs: no device ids, the module runs on the CPU
    parallel = nn.DataParallel(nn.Linear(2, 2))
    assert devices(parallel) == 1
    # what it holds over three GPUs (set here: this machine has none)
    parallel.device_ids = [0, 1, 2]
    assert devices(parallel) == 3


def test_the_peak_is_measured_and_the_datasheet_knows_only_gpus():
    peak = matmul_peak(torch.device("cpu"), torch.float32, seconds=0.05)
    print(f"fp32 matrix-product peak of this process: {peak / 1e9:.1f} GFLOP/s")
    assert 1e8 < peak < 1e14
    assert datasheet_peak(torch.device("cpu"), torch.float32) is None


def test_datasheet_peaks_of_known_gpus(monkeypatch):
    cuda = torch.device("cuda", 0)
    known = [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989.4),
        ("NVIDIA H100 PCIe", torch.float16, 756.0),
        ("NVIDIA H100 80GB HBM3", torch.float32, 66.9),
        ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312.0),
        ("Tesla V100-SXM2-16GB", torch.bfloat16, None),
        ("NVIDIA GeForce RTX 4090", torch.bfloat16, None),
        ("NVIDIA L40", torch.bfloat16, 181.0),
        ("NVIDIA L4", torch.bfloat16, 121.0),
    ]
    for name, dtype, tflops in known:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device, name=name: name)
        assert datasheet_peak(cuda, dtype) == (tflops * 1e12 if tflops else None), name


def test_mfu_is_never_above_one_hundred_percent():
    """A step that outran the peak measured beside it (make demo's ddp+bf16: 247 %) shows that
    measurement missed the device's rate: no MFU, not an impossible one."""
    from rankwise.measure.flops import mfu

    assert mfu(50.0, 100.0) == 0.5
    assert mfu(247.0, 100.0) is None
    assert mfu(50.0, None) is None and mfu(50.0, 0.0) is None


def test_the_table_prints_a_dash_for_an_mfu_past_the_peak():
    from rankwise.tools.bench.report import mfu_cell

    assert mfu_cell({"mfu": 2.472, "mfu_datasheet": None}) == "—"
    assert mfu_cell({"mfu": 0.25, "mfu_datasheet": 1.3}) == "25.0%"
    assert mfu_cell({"mfu": 0.25, "mfu_datasheet": 0.2}) == "25.0% / 20.0%"


def test_the_peak_is_the_best_of_its_sizes_at_the_dtype_asked():
    from rankwise.measure.flops import PEAK_SIZES, matmul_peak

    assert len(PEAK_SIZES["cpu"]) > 1
    assert matmul_peak(torch.device("cpu"), torch.float32, seconds=0.02) > 0
