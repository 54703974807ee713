"""``ddp``: ``torch.nn.parallel.DistributedDataParallel``, one process per device."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rankwise.config import DDPConfig
from rankwise.strategies import register
from rankwise.strategies.base import Strategy


@register
class DDP(Strategy):
    name = "ddp"
    description = "DistributedDataParallel, one process per device (torchrun-style or spawn launcher)"

    def setup_module(self, model: nn.Module) -> nn.Module:
        options: DDPConfig = self.config.ddp
        model = super().setup_module(model)
        # device_ids only for a module on one CUDA device; CPU modules and modules split
        # across devices (ToyMpModel) must leave it unset.
        on_one_cuda_device = self.device.type == "cuda" and len({p.device for p in model.parameters()}) == 1
        return DistributedDataParallel(
            model,
            device_ids=[self.device.index] if on_one_cuda_device else None,
            bucket_cap_mb=options.bucket_cap_mb,
            find_unused_parameters=options.find_unused_parameters,
            static_graph=options.static_graph,
            gradient_as_bucket_view=options.gradient_as_bucket_view,
        )

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def no_sync(self, model: nn.Module):
        # Why: skipping the all-reduce on all but the last micro-batch is what makes
        # accumulation cost one synchronisation per optimizer step.
        return model.no_sync()
