"""Each strategy's own options: one validated section per strategy, one docstring per field.

These are the ``ddp``, ``deepspeed`` and ``horovod`` sections of a run configuration
(``--set ddp.bucket_cap_mb=50``) and what ``rankwise.setup(strategy, options=...)``
takes in a user's own loop.  Nothing here knows the training loop: the loop's own facts
(accumulation, micro-batch size) reach a strategy through ``Runtime.prepare``.
"""

from __future__ import annotations

from typing import Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field


def parse_value(raw: str) -> Any:
    """A ``--set`` value as a TOML literal (numbers, booleans, arrays, quoted strings), else a bare
    string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


class Options(BaseModel):
    """A strict section: unknown keys and wrong types are errors naming the key."""

    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True
    )


class DDPOptions(Options):
    bucket_cap_mb: float = Field(25.0, gt=0)
    """Gradient bucket size for DDP's all-reduce, in MB."""
    find_unused_parameters: bool = False
    """Let DDP tolerate parameters that get no gradient (costs a graph traversal per step)."""
    static_graph: bool = False
    """Tell DDP the graph never changes between steps (enables some optimisations)."""
    gradient_as_bucket_view: bool = True
    """Gradients alias DDP's communication buckets: saves one copy and memory."""
    broadcast_buffers: Literal["auto", "always", "never"] = "auto"
    """Rank 0's module buffers broadcast at every forward (a blocking collective per step): `auto`
    only when the model has persistent buffers training can change (BatchNorm running statistics);
    constant ones (BERT's position ids) need no per-step copy."""
    comm_hook: Literal["none", "fp16_compress", "bf16_compress", "powersgd"] = "none"
    """How DDP's gradient all-reduce sends: `none` exact fp32; `fp16_compress` / `bf16_compress`
    round gradients to 16 bits before averaging (half the bytes; weights then differ from one
    process by the rounding, about 1e-3 of a step); `powersgd` sends a low-rank approximation with
    error feedback (far fewer bytes, approximate gradients; its error state is not checkpointed)."""
    powersgd_rank: int = Field(1, ge=1)
    """PowerSGD's matrix approximation rank: higher is closer to the exact gradient and sends
    more."""
    powersgd_start_step: int = Field(10, ge=1)
    """Optimizer steps with exact all-reduce before PowerSGD starts compressing (its warm-up)."""


class DeepSpeedOptions(Options):
    zero_stage: int = Field(2, ge=0, le=3)
    """ZeRO stage: 0 plain data parallel, 1 shards optimizer state, 2 also gradients, 3 also
    parameters."""
    offload_optimizer: bool = False
    """Keep optimizer state (and its step) on the CPU (ZeRO stage >= 1)."""
    offload_param: bool = False
    """Keep parameters on the CPU between uses (ZeRO stage 3)."""
    bucket_size: int = Field(5_000_000, gt=0)
    """Elements per gradient-reduction bucket, per ZeRO-3 parameter prefetch and per ZeRO-3
    optimizer sub-group (reduce_bucket_size, stage3_prefetch_bucket_size, sub_group_size);
    DeepSpeed's own 5e8 and 1e9 hold a whole 100M-parameter model's gradients in one extra
    buffer."""
    max_live_parameters: int = Field(10_000_000, gt=0)
    """ZeRO-3: gathered parameters kept resident at most (stage3_max_live_parameters,
    stage3_max_reuse_distance); DeepSpeed's own 1e9 keeps every layer of most models gathered,
    undoing the sharding."""
    config_file: str | None = None
    """A DeepSpeed JSON config merged over the generated one (batch sizes, clipping and precision
    stay rankwise's)."""


class HorovodOptions(Options):
    fp16_compression: bool = False
    """Send gradients as fp16 over the wire (halves traffic; averaging then loses precision)."""
