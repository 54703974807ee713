"""DeepSpeed ZeRO: each test shows the upstream behaviour a workaround exists for, on the installed
release."""

import inspect
from types import SimpleNamespace

import pytest
import torch

from rankwise.compat import deepspeed_zero

deepspeed = pytest.importorskip(
    "deepspeed", reason="DeepSpeed is not installed (pip install 'rankwise[deepspeed]')"
)


def test_zero3_still_compares_a_device_with_a_device_string_so_fp32_keeps_a_master_copy():
    """When this fails, ZeRO-3 recognises fp32 partitions on its device itself: drop
    alias_fp32_masters."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    assert "self.device = get_accelerator().current_device_name()" in inspect.getsource(
        Stage3.__init__
    )
    assert ".device == self.device" in inspect.getsource(Stage3._create_fp32_partitions)
    name = get_accelerator().current_device_name()
    assert isinstance(name, str) and torch.empty(0, device=name).device != name  # never equal


def test_aliasing_points_each_master_at_its_partition():
    partitions = [torch.ones(6), torch.ones(4)]
    masters = [p.clone() for p in partitions]
    zero = SimpleNamespace(
        fp32_partitioned_groups_flat=masters, fp16_partitioned_groups_flat=partitions
    )
    assert deepspeed_zero.alias_fp32_masters(zero) == 10
    assert all(m.data_ptr() == p.data_ptr() for m, p in zip(masters, partitions, strict=True))
    assert (
        deepspeed_zero.alias_fp32_masters(SimpleNamespace(**vars(zero), offload_optimizer=True))
        == 0
    )


@pytest.mark.multiproc
def test_deepspeed_still_builds_the_shared_memory_kernel_on_cpu_unless_told_it_is_incompatible(
    monkeypatch,
):
    """When this fails, DeepSpeed no longer builds the kernel for training on CPU: drop
    skip_shm_comm_build."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.comm.torch import build_shm_op

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None:
        pytest.skip(
            f"DeepSpeed's {get_accelerator()._name} accelerator has no shared-memory kernel to "
            "build"
        )
    # left alone, TorchBackend's build_shm_op JIT-compiles it (minutes)
    assert builder.is_compatible()
    monkeypatch.setitem(deepspeed.ops.__compatible_ops__, builder.NAME, True)
    deepspeed_zero.skip_shm_comm_build()
    assert build_shm_op() is None  # returned before building anything


def test_deepspeed_still_fixes_clipping_at_initialize():
    """When this fails, DeepSpeed can set clipping per step: use its API instead of
    clipping_for_one_step."""
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    assert not [name for name in dir(DeepSpeedEngine) if "clip" in name and name.startswith("set")]
    assert (
        DeepSpeedEngine.gradient_clipping(
            SimpleNamespace(_config=SimpleNamespace(gradient_clipping=3.0))
        )
        == 3.0
    )
    for zero in (DeepSpeedZeroOptimizer, DeepSpeedZeroOptimizer_Stage3):
        assert "self.clip_grad" in inspect.getsource(zero)


def test_clipping_for_one_step_sets_both_limits_and_restores_them():
    engine, zero = (
        SimpleNamespace(_config=SimpleNamespace(gradient_clipping=0.0)),
        SimpleNamespace(clip_grad=0.0),
    )
    with deepspeed_zero.clipping_for_one_step(engine, zero, 2.5):
        assert (engine._config.gradient_clipping, zero.clip_grad) == (2.5, 2.5)
    assert (engine._config.gradient_clipping, zero.clip_grad) == (0.0, 0.0)


class _LastRankOfThree:
    """ZeRO-3's view of a 100-element parameter on rank 2 of 3: partitions of 34, the last one
    padded by 2."""

    def __init__(self):
        self.partition = torch.full((34,), -1.0)

    def _get_fp32_opt_state_partition(self, param, release_swap_buffers, optim_state_key=None):
        return self.partition, 0

    def _get_param_partition_rank(self, param):
        return 2

    def _get_param_partition_world_size(self, param):
        return 3

    def _swappable_optimizer_subgroup(self, group):
        return False


def test_zero3_still_reads_past_the_unpadded_value_on_the_last_rank():
    """When this fails, DeepSpeed pads the value itself: drop set_zero3_partition's padding."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    param = SimpleNamespace(requires_grad=True, ds_numel=100)
    with pytest.raises(
        RuntimeError, match=r"start \(68\) \+ length \(34\) exceeds dimension size \(100\)"
    ):
        Stage3.set_full_hp_param(_LastRankOfThree(), torch.arange(100.0), param)


def test_the_padded_value_gives_the_last_rank_its_slice():
    zero = _LastRankOfThree()
    deepspeed_zero.set_zero3_partition(
        zero, SimpleNamespace(ds_numel=100), torch.arange(100.0), None
    )
    assert torch.equal(zero.partition, torch.cat([torch.arange(68.0, 100.0), torch.zeros(2)]))
