"""``ddp``: ``torch.nn.parallel.DistributedDataParallel``, one process per device.

One strategy, two launchers: ``ddp`` starts under torchrun's agent, the ``ddp-spawn``
variant under ``torch.multiprocessing`` spawn (the source documents' ``mp.spawn``).
"""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rankwise.strategies import register, register_variant
from rankwise.strategies.base import Strategy
from rankwise.strategies.options import DDPOptions


@register
class DDP(Strategy):
    name = "ddp"
    description = "DistributedDataParallel, one process per device (torchrun-style launcher)"
    options_section = "ddp"
    options_cls = DDPOptions
    options: DDPOptions

    def setup_module(self, model: nn.Module) -> nn.Module:
        model = super().setup_module(model)
        # device_ids only for a module on one CUDA device; CPU modules and modules split
        # across devices (ToyMpModel) must leave it unset.
        on_one_cuda_device = self.device.type == "cuda" and len({p.device for p in model.parameters()}) == 1
        return DistributedDataParallel(
            model,
            device_ids=[self.device.index] if on_one_cuda_device else None,
            bucket_cap_mb=self.options.bucket_cap_mb,
            find_unused_parameters=self.options.find_unused_parameters,
            static_graph=self.options.static_graph,
            gradient_as_bucket_view=self.options.gradient_as_bucket_view,
        )

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def no_sync(self, model: nn.Module):
        # Why: skipping the all-reduce on all but the last micro-batch is what makes
        # accumulation cost one synchronisation per optimizer step.
        return model.no_sync()


register_variant("ddp-spawn", "ddp", {"launch.launcher": "spawn"},
                 "DistributedDataParallel started by torch.multiprocessing spawn (mp.spawn)")
