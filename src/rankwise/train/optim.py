"""The built-in task's optimizer and learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from rankwise.train.config import TrainConfig


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only: never on biases, LayerNorm weights or other 1-D parameters."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "norm" in name.lower() else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizer(
    model: nn.Module, cfg: TrainConfig, device: torch.device
) -> torch.optim.Optimizer:
    o = cfg.optim
    # The fused kernel is one pass over all parameters on CPU and CUDA alike.
    return torch.optim.AdamW(
        parameter_groups(model, o.weight_decay),
        lr=o.lr,
        betas=o.betas,
        eps=o.eps,
        fused=device.type in ("cpu", "cuda"),
    )


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int):
    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress

    return factor
