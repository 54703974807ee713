"""Resume within a strategy: a run cut after step 4 and resumed ends with exactly the weights the
uninterrupted run reached, also where model and optimizer state are sharded (FSDP shards, DeepSpeed
ZeRO partitions).  Whole state (one optimizer file) also continues at another world size or under
another whole-state strategy, within the stated tolerance."""

import json

import pytest

from rankwise.checkpoint import read_weights
from rankwise.measure.tolerance import EXACT, max_param_diff
from tests.support.multiproc import RanksFailed, run_ranks
from tests.support.strategies import cut_back, strategies_for, train_toy

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)


# every registered multi-process strategy
@pytest.mark.parametrize("strategy", strategies_for("resume"))
def test_resume_after_a_cut_equals_the_uninterrupted_run(strategy, toy, tmp_path):
    run_ranks(train_toy, 2, str(tmp_path), str(toy), strategy)
    checkpoints = tmp_path / "checkpoints"
    uninterrupted = cut_back(checkpoints, "step-00000008", "step-00000004")
    run_ranks(train_toy, 2, str(tmp_path), str(toy), strategy, "resume=latest")
    resumed, at_the_cut = read_weights(checkpoints), read_weights(checkpoints / "step-00000004")
    assert resumed.keys() == uninterrupted.keys()
    assert max_param_diff(at_the_cut, resumed) > 0  # the resumed run really trained steps 5-8
    difference = max_param_diff(uninterrupted, resumed)
    assert difference == 0.0, f"{strategy}: resumed run differs by {difference:.2e}"


@pytest.mark.parametrize(
    ("written_by", "strategy", "ranks"),
    [
        ("ddp", "single", 1),
        ("ddp", "ddp", 3),
        ("ddp", "accelerate", 2),
        ("fsdp", "fsdp", 3),
        ("fsdp", "fsdp", 1),  # DCP regroups FSDP's shards
        # whole state and FSDP's shards convert by parameter name
        ("ddp", "fsdp", 2),
        ("fsdp", "ddp", 3),
    ],
)
def test_a_checkpoint_continues_at_another_world_size_or_strategy(
    written_by, strategy, ranks, toy, tmp_path
):
    """The global batch (24) is the same at 1, 2 and 3 ranks: steps 5-8 take the same global
    batches."""
    run_ranks(train_toy, 2, str(tmp_path), str(toy), written_by, "batch_size=24", "model.dropout=0")
    checkpoints = tmp_path / "checkpoints"
    uninterrupted = cut_back(checkpoints, "step-00000008", "step-00000004")
    run_ranks(
        train_toy,
        ranks,
        str(tmp_path),
        str(toy),
        strategy,
        "batch_size=24",
        "model.dropout=0",
        "resume=latest",
    )
    resumed, at_the_cut = read_weights(checkpoints), read_weights(checkpoints / "step-00000004")
    assert max_param_diff(at_the_cut, resumed) > 0  # the resumed run really trained steps 5-8
    difference = max_param_diff(uninterrupted, resumed)
    print(
        f"{written_by} x2 -> {strategy} x{ranks}: max |uninterrupted - resumed| = {difference:.2e}"
    )
    assert difference <= EXACT
    record = json.loads((tmp_path / "continuity.json").read_text())
    assert record["continuous"] and all(record["checks"].values()), record
    assert (record["position"], record["first_step_samples"], record["first_step_distinct"]) == (
        4 * 24,
        24,
        24,
    )
    assert (record["written"], record["resumed"]) == (
        {"strategy": written_by, "world_size": 2},
        {"strategy": strategy, "world_size": ranks},
    )
    assert record["lr"]["at_checkpoint"] == record["lr"]["resumed"]
    # `rankwise export` reads the resumed run's checkpoint like any other: its full weights.
    from rankwise import cli

    exported = tmp_path / "exported.safetensors"
    assert (
        cli.main(["export", "--checkpoint", str(checkpoints / "latest"), "--out", str(exported)])
        == 0
    )
    assert max_param_diff(read_weights(exported), resumed) == 0.0


@pytest.mark.parametrize(
    ("written_by", "strategy", "ranks"),
    [
        ("deepspeed-zero2", "deepspeed-zero2", 3),
        ("deepspeed-zero2", "deepspeed-zero2", 1),
        ("deepspeed-zero3", "deepspeed-zero3", 3),
        ("deepspeed-zero3", "deepspeed-zero3", 1),
        ("deepspeed-zero3", "deepspeed-zero2", 2),
        ("deepspeed-zero2", "fsdp", 1),
        ("deepspeed-zero2", "ddp", 2),
        ("ddp", "deepspeed-zero3", 3),  # 10x10 weights on 3 ranks: the last partition is padded
        ("deepspeed-zero0", "ddp", 2),  # stage 0 keeps the optimizer whole
    ],
)
def test_deepspeed_partitions_regroup_for_another_world_size_or_strategy(
    written_by, strategy, ranks, toy, tmp_path
):
    """DeepSpeed's universal conversion regroups ZeRO partitions; ZeRO-3 and ZeRO 1-2 take their
    share of the whole state at any world size."""
    test_a_checkpoint_continues_at_another_world_size_or_strategy(
        written_by, strategy, ranks, toy, tmp_path
    )


def test_deepspeed_at_bf16_continues_a_fp32_checkpoint_and_stage_0_says_it_cannot(toy, tmp_path):
    """16-bit DeepSpeed keeps fp32 master weights: ZeRO-2 cuts them from the checkpoint (within
    bf16's tolerance of the fp32 run); stage 0's own 16-bit wrapper cannot take them, and says
    so."""
    from rankwise.measure.tolerance import tolerance

    run_ranks(train_toy, 2, str(tmp_path), str(toy), "ddp", "batch_size=24", "model.dropout=0")
    checkpoints = tmp_path / "checkpoints"
    uninterrupted = cut_back(checkpoints, "step-00000008", "step-00000004")
    with pytest.raises(RanksFailed, match="DeepSpeed ZeRO stage 0 at bf16-mixed cannot continue"):
        run_ranks(
            train_toy,
            2,
            str(tmp_path),
            str(toy),
            "deepspeed-zero0",
            "batch_size=24",
            "model.dropout=0",
            "precision=bf16-mixed",
            "resume=latest",
        )
    run_ranks(
        train_toy,
        2,
        str(tmp_path),
        str(toy),
        "deepspeed-zero2",
        "batch_size=24",
        "model.dropout=0",
        "precision=bf16-mixed",
        "resume=latest",
    )
    difference = max_param_diff(uninterrupted, read_weights(checkpoints))
    print(
        "ddp x2 (fp32) -> deepspeed-zero2 x2 (bf16-mixed): max |uninterrupted - resumed| = "
        f"{difference:.2e}"
    )
    assert 0 < difference <= tolerance("bf16-mixed")
