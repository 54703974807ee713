"""``dp``: ``torch.nn.DataParallel``: one process drives every visible GPU.

Each step scatters the batch over the GPUs, replicates the module, and gathers outputs on GPU 0,
which becomes the bottleneck; it cannot span machines.  Kept so that ``rankwise bench`` can measure
it against DDP; prefer ``ddp``.  Without GPUs it runs the module on the CPU and says so once.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from typing_extensions import override

from rankwise.strategies import register
from rankwise.strategies.facts import Facts
from rankwise.strategies.single import SingleDevice


@register
class DataParallel(SingleDevice):
    """One process like ``single``; only the module wrapping differs."""

    name = "dp"
    description = (
        "nn.DataParallel over the visible GPUs of one process (CPU: plain module, with a notice)"
    )
    # One process replicating over its GPUs: bench measures it; the plan (one process per device)
    # has no model of it.
    strategy_facts = Facts(
        layout=None, planned=False, about="DataParallel: one process, one replica per device"
    )
    cannot_compile = (
        "DataParallel copies the module onto every GPU again at each forward, and torch.compile "
        "does not follow the copies; use ddp (one process per GPU), which compiles"
    )

    @override
    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer | None):
        model = self.place(model)
        if self.device.type != "cuda":
            warnings.warn(
                "strategy dp: no CUDA device, so DataParallel runs the module on the CPU in one "
                "process (no parallelism); use ddp for multi-process CPU training",
                stacklevel=2,
            )
            return model, optimizer
        return nn.DataParallel(model, device_ids=list(range(torch.cuda.device_count()))), optimizer

    @override
    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, nn.DataParallel) else model
