"""DataParallel on a CPU-only machine, and mixed precision."""

import warnings

import pytest
import torch

from rankwise.measure.tolerance import max_param_diff
from tests.support.multiproc import run_ranks
from tests.support.strategies import CASES, case_weights, train_case
from tests.support.tiers import starts_processes


def test_dp_on_cpu_runs_the_plain_module_and_says_so(monkeypatch):
    import rankwise
    from rankwise.models.toy_nets import ToyMLP

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with rankwise.setup("dp") as rt, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = rt.prepare(ToyMLP(10, 5))
    assert type(model) is ToyMLP and rt.world_size == 1
    assert any("no CUDA device" in str(w.message) for w in caught)


@pytest.mark.multiproc
def test_dp_matches_single(datasets, tmp_path):
    _, model = CASES["toy-mlp"]
    for strategy in ("single", "dp"):
        run_ranks(
            train_case,
            1,
            str(tmp_path / strategy),
            str(datasets / "toy"),
            [*model, "batch_size=16", f"strategy={strategy}"],
        )
    assert max_param_diff(case_weights(tmp_path / "single"), case_weights(tmp_path / "dp")) == 0.0


# bf16 autocast rounds activations to 8 mantissa bits: far looser than fp32's 1e-5
BF16_TOLERANCE = 2e-3


# DeepSpeed's bf16 mode is not autocast: it keeps the model itself in bf16 (every matmul input and
# gradient rounded) with fp32 master weights in the optimizer, so it drifts further from autocast
# (measured 2.9e-3 after 6 steps).
DEEPSPEED_BF16_TOLERANCE = 6e-3

BF16_COMMON = [*CASES["tiny-bert"][1], "batch_size=16", "precision=bf16-mixed"]


@pytest.fixture(scope="module")
@starts_processes()
def single_bf16(datasets, tmp_path_factory):
    out = tmp_path_factory.mktemp("single-bf16")
    run_ranks(train_case, 1, str(out), str(datasets / "text"), [*BF16_COMMON, "strategy=single"])
    return case_weights(out)


# Test id -> (ranks, overrides, tolerance).  Horovod's bf16 run is in test_horovod.py (it needs
# horovodrun).
BF16_RUNS = {
    "dp": (1, ["strategy=dp"], BF16_TOLERANCE),
    "ddp": (2, ["strategy=ddp"], BF16_TOLERANCE),
    "fsdp": (2, ["strategy=fsdp"], BF16_TOLERANCE),
    "accelerate": (2, ["strategy=accelerate"], BF16_TOLERANCE),
    "deepspeed-zero2": (
        2,
        ["strategy=deepspeed", "deepspeed.zero_stage=2"],
        DEEPSPEED_BF16_TOLERANCE,
    ),
    "deepspeed-zero3": (
        2,
        ["strategy=deepspeed", "deepspeed.zero_stage=3"],
        DEEPSPEED_BF16_TOLERANCE,
    ),
}


@pytest.mark.parametrize("run", BF16_RUNS)
def test_bf16_mixed_stays_close_to_single_bf16(run, datasets, single_bf16, tmp_path):
    ranks, overrides, tolerance = BF16_RUNS[run]
    assert (
        run_ranks(
            train_case,
            ranks,
            str(tmp_path / run),
            str(datasets / "text"),
            [*BF16_COMMON, *overrides],
        )
        == [(6, ranks)] * ranks
    )
    difference = max_param_diff(single_bf16, case_weights(tmp_path / run))
    print(f"bf16 {run}: max |single - {run}| = {difference:.2e}")
    assert difference < tolerance


def test_fp16_on_cpu_is_refused_clearly():
    from rankwise.precision import Precision

    with pytest.raises(ValueError, match="16-mixed needs a CUDA device"):
        Precision("16-mixed", torch.device("cpu"))
