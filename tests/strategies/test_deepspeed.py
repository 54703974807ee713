"""DeepSpeed specifics: ZeRO-3 at fp32 keeps one copy of each parameter partition, and its processes
exit cleanly."""

import pytest

from rankwise.measure.tolerance import max_param_diff
from tests.support.multiproc import run_ranks


def _zero3_partitions(bucket_size: int) -> dict:
    import torch
    from torch import nn

    import rankwise

    with rankwise.setup("deepspeed-zero3", options={"bucket_size": bucket_size}, seed=0) as rt:
        model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
        model, optimizer = rt.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1))
        zero = rt.strategy.engine.optimizer
        masters, partitions = zero.fp32_partitioned_groups_flat, zero.fp16_partitioned_groups_flat
        before = [p.clone() for p in partitions]
        loss = model(torch.randn(2, 64)).square().mean()
        rt.backward(loss, model)
        rt.step(optimizer, model)
        return {
            "sub_groups": len(masters),
            "shared": [m.data_ptr() == p.data_ptr() for m, p in zip(masters, partitions)],
            "updated": [not torch.equal(b, p) for b, p in zip(before, partitions)],
        }


@pytest.mark.multiproc
def test_zero3_fp32_updates_parameter_partitions_in_place_without_a_master_copy():
    # 4,290 parameters, 2,145 per rank: a bucket of 1,000 elements cuts each rank's partition into
    # sub-groups.
    results = run_ranks(_zero3_partitions, 2, 1000)
    for rank, result in enumerate(results):
        assert result["sub_groups"] > 1, (
            f"rank {rank}: sub_group_size did not follow deepspeed.bucket_size"
        )
        assert all(result["shared"]), f"rank {rank}: a fp32 master partition is a separate copy"
        assert all(result["updated"]), (
            f"rank {rank}: the optimizer step did not reach the parameter partitions"
        )


@pytest.mark.multiproc
@pytest.mark.parametrize("attempt", range(3))
def test_zero3_processes_exit_cleanly(attempt):
    """A minimal ZeRO-3 script on CPU aborted with SIGABRT at exit (docs/architecture.md,
    workarounds); rankwise's teardown (engine destroyed before the process group) must let every
    rank exit 0, every time."""
    # fresh=True: dedicated processes that must exit with code 0 after returning their result.
    results = run_ranks(_zero3_partitions, 2, 1000, fresh=True, timeout=120)
    assert all(all(r["updated"]) for r in results), f"attempt {attempt}: ZeRO-3 did not train"


def _deepspeed_config(tmp_path, user_json: str | None, *overrides: str) -> dict:
    from rankwise.process import ProcessEnv
    from rankwise.strategies.base import LoopFacts
    from rankwise.strategies.deepspeed import DeepSpeed
    from rankwise.train.config import build_config

    extra = []
    if user_json is not None:
        (tmp_path / "ds.json").write_text(user_json, encoding="utf-8")
        extra = [f"deepspeed.config_file={tmp_path / 'ds.json'}"]
    cfg = build_config(overrides=["strategy=deepspeed", *extra, *overrides])
    DeepSpeed.check_options(cfg.deepspeed)
    return DeepSpeed(ProcessEnv.detect(), options=cfg.deepspeed).ds_config(
        LoopFacts(grad_accum=2, micro_batch_size=16)
    )


def test_user_json_is_merged_over_the_generated_config(tmp_path):
    config = _deepspeed_config(
        tmp_path, '{"zero_optimization": {"overlap_comm": true}, "steps_per_print": 5}'
    )
    assert config["steps_per_print"] == 5
    assert config["zero_optimization"]["overlap_comm"] is True
    assert config["zero_optimization"]["stage"] == 2  # rankwise's keys stay
    assert (config["gradient_accumulation_steps"], config["train_micro_batch_size_per_gpu"]) == (
        2,
        16,
    )


@pytest.mark.parametrize(
    "user_json, message",
    [
        (
            '{"train_batch_size": 64, "gradient_clipping": 0.5}',
            "gradient_clipping, train_batch_size come from rankwise",
        ),
        ('{"zero_optimization": ', "ds.json"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_user_json_is_refused_naming_the_file(tmp_path, user_json, message):
    from rankwise.train.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        _deepspeed_config(tmp_path, user_json)


def test_parameter_offload_needs_stage_3(tmp_path):
    from rankwise.train.config import ConfigError

    with pytest.raises(ConfigError, match="offload_param needs deepspeed.zero_stage=3"):
        _deepspeed_config(tmp_path, None, "deepspeed.offload_param=true")
    zero = _deepspeed_config(
        tmp_path,
        None,
        "deepspeed.offload_param=true",
        "deepspeed.zero_stage=3",
        "deepspeed.offload_optimizer=true",
    )["zero_optimization"]
    assert zero["offload_param"] == zero["offload_optimizer"] == {"device": "cpu"}


def _zero3_weights_round_trip() -> dict:
    import torch
    from torch import nn

    import rankwise

    # A bucket of 1,000 elements: the 4,160-element first layer is gathered alone, the rest
    # together.
    with rankwise.setup("deepspeed-zero3", options={"bucket_size": 1000}, seed=0) as rt:
        model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
        original = {k: v.clone() for k, v in model.state_dict().items()}
        probe = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
        expected = model(probe).detach()
        model, optimizer = rt.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1))
        gathered = rt.state_dict(model)
        rt.backward(model(probe).square().mean(), model)
        rt.step(optimizer, model)
        moved = not torch.allclose(model(probe), expected)
        rt.strategy.load_model_state_dict(model, original)  # rank 0's copy goes to every partition
        with torch.no_grad():
            restored = torch.allclose(model(probe), expected, atol=1e-6)
        return {
            "keys": sorted(gathered),
            "equal": all(torch.equal(gathered[k], original[k]) for k in gathered),
            "moved": moved,
            "restored": restored,
        }


@pytest.mark.multiproc
def test_zero3_gathers_full_weights_on_rank_0_only_and_loads_them_back():
    main, other = run_ranks(_zero3_weights_round_trip, 2)
    assert main["keys"] == ["0.bias", "0.weight", "2.bias", "2.weight"] and main["equal"]
    assert other["keys"] == []  # no second full copy on the other ranks
    for result in (main, other):
        assert result["moved"] and result["restored"], result


def _train_three_steps(precision: str, *overrides: str) -> dict:
    import torch
    from torch import nn

    import rankwise

    options = {key: value for key, value in (item.split("=") for item in overrides)}
    with rankwise.setup("deepspeed", precision, options=options, seed=0) as rt:
        model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 2))
        model, optimizer = rt.prepare(
            model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
        )
        batches = torch.Generator().manual_seed(rt.rank)
        for _ in range(3):
            # float features
            loss = model(torch.randn(2, 16, generator=batches)).float().square().mean()
            rt.backward(loss, model)
            rt.step(optimizer, model)
            rt.zero_grad(optimizer)
        return rt.state_dict(model)


@pytest.mark.multiproc
@pytest.mark.parametrize(
    "stage, offload",
    [
        (2, ["offload_optimizer=true"]),
        (3, ["offload_optimizer=true", "offload_param=true"]),
    ],
    ids=["zero2-optimizer", "zero3-optimizer-and-parameters"],
)
def test_cpu_offload_trains_like_no_offload(stage, offload):
    """DeepSpeed refuses a client optimizer with offload unless told otherwise; the loop's AdamW
    then steps the offloaded partitions and must give the same weights."""
    plain = run_ranks(_train_three_steps, 2, "32-true", f"zero_stage={stage}")[0]
    offloaded = run_ranks(_train_three_steps, 2, "32-true", f"zero_stage={stage}", *offload)[0]
    difference = max_param_diff(plain, offloaded)
    assert difference < 1e-6, difference


@pytest.mark.multiproc
def test_bf16_casts_float_inputs_for_the_bf16_model():
    """DeepSpeed's bf16 casts the weights, not keyword or feature inputs: rankwise does that."""
    bf16 = run_ranks(_train_three_steps, 2, "bf16-mixed", "zero_stage=2")[0]
    fp32 = run_ranks(_train_three_steps, 2, "32-true", "zero_stage=2")[0]
    difference = max_param_diff(bf16, fp32)
    assert 0 < difference < 6e-3, difference  # bf16 ran, and stayed close to fp32
