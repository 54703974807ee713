"""DeepSpeed ZeRO: a fp32 master copy it meant to skip, a CPU kernel built for nothing, clipping
fixed at start-up, and a setter that reads past the end of the last partition."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from rankwise.compat.versions import Workaround

SEEN_ON = ("0.19",)
NONE_FILED = "none filed (searched deepspeedai/DeepSpeed issues)"
ALIAS_FP32_MASTERS = Workaround(
    name="rankwise.compat.deepspeed_zero.alias_fp32_masters",
    library="deepspeed",
    upstream=f"{NONE_FILED}: stage3.py _create_fp32_partitions compares a torch.device with a "
    "device string",
    seen_on=SEEN_ON,
)
SKIP_SHM_COMM_BUILD = Workaround(
    name="rankwise.compat.deepspeed_zero.skip_shm_comm_build",
    library="deepspeed",
    upstream=f"{NONE_FILED}: comm/torch.py TorchBackend builds the shared-memory op for every CPU "
    "run",
    seen_on=SEEN_ON,
)
CLIP_FOR_ONE_STEP = Workaround(
    name="rankwise.compat.deepspeed_zero.clipping_for_one_step",
    library="deepspeed",
    upstream=f"{NONE_FILED}: no API sets gradient clipping after deepspeed.initialize (the engine "
    "reads _config.gradient_clipping, ZeRO 1-3 their clip_grad)",
    seen_on=SEEN_ON,
)
PAD_LAST_PARTITION = Workaround(
    name="rankwise.compat.deepspeed_zero.set_zero3_partition",
    library="deepspeed",
    upstream=f"{NONE_FILED}: stage3.py set_full_hp_param narrows the unpadded value",
    seen_on=SEEN_ON,
)


def alias_fp32_masters(zero_optimizer) -> int:
    """Let ZeRO-3 update fp32 parameter partitions in place instead of through a master copy;
    returns the number of elements no longer duplicated.

    DeepSpeed means to skip the fp32 master copy when the partitioned parameters are already fp32 on
    the optimizer's device (``_create_fp32_partitions``), but it compares a ``torch.device`` with a
    device *string*, never equal, so a fp32 run keeps a second copy of its partition: 4/N bytes per
    parameter.  Pointing each master tensor at its parameter partition is the aliasing DeepSpeed
    designed for that case (its step then copies the partition onto itself); optimizer state stays
    keyed by the same tensor objects."""
    masters = getattr(zero_optimizer, "fp32_partitioned_groups_flat", None)
    partitions = getattr(zero_optimizer, "fp16_partitioned_groups_flat", None)
    if (
        not masters
        or not partitions
        or getattr(zero_optimizer, "offload_optimizer", False)
        or not ALIAS_FP32_MASTERS.applies()
    ):
        return 0
    freed = 0
    for master, partition in zip(masters, partitions):
        if (
            partition is None
            or master is partition
            or master.dtype != partition.dtype
            or master.device != partition.device
            or master.shape != partition.shape
        ):
            continue
        master.data = partition.data
        freed += partition.numel()
    return freed


def skip_shm_comm_build() -> None:
    """Tell DeepSpeed its CPU shared-memory all-reduce kernel is unavailable, before its
    communication layer starts.

    DeepSpeed's CPU backend JIT-compiles that kernel when ``init_distributed`` runs (1-2 minutes on
    2 cores, again for every new virtualenv); only inference tensor parallelism uses it, training
    reduces through torch.distributed."""
    if not SKIP_SHM_COMM_BUILD.applies():
        return
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


@contextlib.contextmanager
def clipping_for_one_step(engine, zero_optimizer, max_norm: float):
    """Clip at ``max_norm`` inside the engine step taken in this block, then no more (rankwise
    configures ``gradient_clipping: 0``).  DeepSpeed fixes clipping at ``deepspeed.initialize``:
    under ZeRO its optimizer clips inside its step with ``clip_grad``, and the engine reads
    ``_config.gradient_clipping``; both are set for the block and restored after it."""
    # The record is for its version warning only: DeepSpeed has no per-step clipping API to switch
    # to, so it has no fixed_in, and the attributes below are set on every release.
    CLIP_FOR_ONE_STEP.applies()
    zero_optimizer.clip_grad = max_norm
    engine._config.gradient_clipping = max_norm
    try:
        yield
    finally:
        zero_optimizer.clip_grad = 0.0
        engine._config.gradient_clipping = 0.0


def set_zero3_partition(
    zero_optimizer, parameter: nn.Parameter, value: torch.Tensor, key: str | None
) -> None:
    """Write this rank's slice of a full ZeRO-3 master weight (``key`` None) or optimizer state
    ``key``.

    DeepSpeed's own ``safe_set_full_fp32_param`` / ``safe_set_full_optimizer_state`` narrow the
    unpadded value, so on the last rank of a parameter whose size does not divide by the world size
    they read past its end (0.19.8: "start (68) + length (34) exceeds dimension size (100)"); here
    the value is padded to the partitions' total."""
    if not PAD_LAST_PARTITION.applies():
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        if key is None:
            safe_set_full_fp32_param(parameter, value)
        else:
            safe_set_full_optimizer_state(parameter, value, key)
        return
    partition, _ = zero_optimizer._get_fp32_opt_state_partition(
        parameter, release_swap_buffers=False, optim_state_key=key
    )
    padded = value.new_zeros(
        partition.numel() * zero_optimizer._get_param_partition_world_size(parameter)
    )
    padded[: value.numel()] = value.flatten()
    rank = zero_optimizer._get_param_partition_rank(parameter)
    partition.data.copy_(padded.narrow(0, partition.numel() * rank, partition.numel()))
