"""Every rank starts from rank 0's weights: what DDP does for itself, done before any strategy
shards the model.

A script that builds its model before ``rankwise.setup(seed=...)`` (or draws from an unseeded
generator) builds other initial weights on every rank.  DDP broadcasts rank 0's copy when it wraps
the model; FSDP and ZeRO-3 keep each rank's own shard of each rank's own draw, and the run trains a
model no rank ever built.  :func:`agree_with_rank0` compares a fingerprint of every tensor (its
float64 sum and norm, on the device: no gather of the model) and, where any rank differs, broadcasts
rank 0's tensors in place and says so once, from rank 0.
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist
from torch import nn

from rankwise import dist
from rankwise.logs import get_logger

log = get_logger(__name__)


def _tensors(model: nn.Module) -> list[torch.Tensor]:
    """The model's parameters and buffers that hold values of their own (not on the meta device, not
    already partitioned by DeepSpeed's ``zero.Init``), each once."""
    seen, tensors = set(), []
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in seen or tensor.is_meta or hasattr(tensor, "ds_id"):
            continue
        seen.add(id(tensor))
        tensors.append(tensor)
    return tensors


def fingerprint(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Per tensor, its sum and its norm accumulated in float64, where it lies: two numbers that tell
    two independent draws apart without copying or gathering the tensor."""
    rows = []
    for tensor in tensors:
        # (integer buffers)
        values = tensor.detach() if tensor.is_floating_point() else tensor.detach().double()
        rows.append(
            torch.stack(
                [
                    torch.sum(values, dtype=torch.float64),
                    torch.linalg.vector_norm(values, dtype=torch.float64),
                ]
            ).to(device)
        )
    return torch.stack(rows) if rows else torch.zeros(0, 2, dtype=torch.float64, device=device)


def agree_with_rank0(model: nn.Module, device: torch.device) -> list[int]:
    """Give every rank rank 0's weights and buffers where any rank's differ (call on every rank of a
    torch process group, before the strategy wraps ``model``); returns the ranks that had built
    other values."""
    if not torch_dist.is_initialized() or dist.world_size() == 1:
        return []  # (Horovod broadcasts rank 0's state itself, without a torch process group)
    tensors = _tensors(model)
    # Why: one small all-gather of fingerprints decides, on every rank alike, whether a broadcast is
    # needed.
    gathered = dist.all_gather_object(fingerprint(tensors, device).cpu().tolist())
    others = [rank for rank in range(1, len(gathered)) if gathered[rank] != gathered[0]]
    if not others:
        return []
    with torch.no_grad():
        for tensor in tensors:
            # Why: rank 0's copy, in place, so the optimizer built on these parameters keeps them
            # (through the device: NCCL broadcasts only GPU tensors).
            whole = dist.broadcast(tensor.detach().to(device), src=0)
            if whole is not tensor:
                tensor.copy_(whole)
    log.warning(
        "rankwise: ranks %s built other initial weights than rank 0 (a model built before "
        "rankwise.setup(seed=...), or from an unseeded generator); every rank now starts from "
        "rank 0's. Build the model after setup() for the same weights without this broadcast.",
        ", ".join(map(str, others)),
    )
    return others
