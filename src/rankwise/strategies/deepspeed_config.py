"""The DeepSpeed config rankwise generates from its own flags, and a user's JSON merged on top of
it."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rankwise.errors import ConfigError
from rankwise.strategies.base import LoopFacts
from rankwise.strategies.options import DeepSpeedOptions

# DeepSpeed keys that rankwise derives from its own flags; a user JSON must not set them.
OWNED_KEYS = {
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
    "gradient_clipping",
    "bf16",
    "fp16",
}


def read_user_config(options: DeepSpeedOptions) -> dict:
    """The JSON of ``deepspeed.config_file``; a ConfigError names the file for bad JSON or keys
    rankwise owns."""
    path = options.config_file
    assert path is not None  # called where deepspeed.config_file is set
    try:
        user = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"deepspeed.config_file={path!r}: {e}") from None
    if not isinstance(user, dict):
        raise ConfigError(
            f"deepspeed.config_file={path!r}: expected a JSON object, got {type(user).__name__}"
        )
    if user.get("zero_optimization", {}).get("compute_grad_norm") is False:
        raise ConfigError(
            f"{path}: zero_optimization.compute_grad_norm=false leaves rt.step(max_norm=...) no "
            "norm to return; remove it"
        )
    clashes = sorted(OWNED_KEYS & user.keys())
    if clashes:
        raise ConfigError(
            f"{path}: {', '.join(clashes)} come from rankwise's --batch-size, --grad-accum, "
            "clipping (rt.step's max_norm) and --precision; remove them from the JSON"
        )
    return user


def generated_config(
    ds: DeepSpeedOptions, facts: LoopFacts, world_size: int, dtype: torch.dtype
) -> dict:
    """``deepspeed.initialize``'s config for these options and loop facts (``dtype``: the
    precision's)."""
    # DeepSpeed checks train_batch_size = micro x accumulation x world size; the loop's own
    # loader decides the real batch, so an unknown micro-batch is counted as 1.
    micro = facts.micro_batch_size or 1
    zero: dict = {"stage": ds.zero_stage, "reduce_bucket_size": ds.bucket_size}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if ds.offload_param:
        zero["offload_param"] = {"device": "cpu"}
    if ds.zero_stage == 3:
        zero.update(
            stage3_gather_16bit_weights_on_model_save=True,
            stage3_prefetch_bucket_size=ds.bucket_size,
            stage3_max_live_parameters=ds.max_live_parameters,
            stage3_max_reuse_distance=ds.max_live_parameters,
            # The optimizer step flattens one sub-group's gradients into a fresh buffer at a
            # time; DeepSpeed's 1e9 makes that a second copy of the whole gradient partition.
            sub_group_size=ds.bucket_size,
        )
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": facts.grad_accum,
        "train_batch_size": micro * facts.grad_accum * world_size,
        "gradient_clipping": 0.0,  # only when the loop steps with max_norm, for that step
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        # The loop's own AdamW steps the offloaded partitions on the CPU (DeepSpeed otherwise
        # insists on its JIT-compiled CPU Adam).
        "zero_force_ds_cpu_optimizer": False,
        "bf16": {"enabled": dtype == torch.bfloat16},
        "fp16": {"enabled": dtype == torch.float16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if ds.config_file:
        user = read_user_config(ds)
        config = {
            **config,
            **user,
            "zero_optimization": {**zero, **user.get("zero_optimization", {})},
        }
    return config
