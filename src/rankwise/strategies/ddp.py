"""``ddp``: ``torch.nn.parallel.DistributedDataParallel``, one process per device.

One strategy, two launchers: ``ddp`` starts under torchrun's agent, the ``ddp-spawn``
variant under ``torch.multiprocessing`` spawn (``mp.spawn``, a Python function per process).
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any, cast

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from rankwise import dist
from rankwise.strategies import register, register_variant
from rankwise.strategies.base import Strategy
from rankwise.strategies.facts import BenchRow, Facts, StepCall
from rankwise.strategies.options import DDPOptions

ALL_REDUCE = StepCall(
    "all_reduce",
    "gradients",
    "buckets",
    "backward",
    "gradients",
    # each bucket's all-reduce starts when its gradients are ready (reducer.cpp), so they overlap
    # the backward pass; once a step (no_sync on the other micro-batches)
    bucket=int(DDPOptions().bucket_cap_mb * 2**20),
)
FACTS = Facts(
    step=(ALL_REDUCE,),
    layout="reducer-buckets",
    bench="smoke",
    about="DistributedDataParallel under torchrun's agent",
    bench_rows=(
        BenchRow("+bf16", ("precision=bf16-mixed",), "DDP with bf16 autocast", "quick"),
        BenchRow("+fp16-hook", ("ddp.comm_hook=fp16_compress",), "DDP averaging gradients in fp16"),
        BenchRow(
            "+bf16-hook",
            ("ddp.comm_hook=bf16_compress",),
            "DDP averaging gradients in bf16",
            "opt-in",
        ),
        BenchRow(
            "+powersgd",
            ("ddp.comm_hook=powersgd", "ddp.powersgd_start_step=2"),
            "DDP sending a rank-1 PowerSGD approximation of the gradients",
            "opt-in",
        ),
        BenchRow("+compile", ("compile=true",), "DDP with torch.compile (inductor) after the wrap"),
    ),
)


@register
class DDP(Strategy):
    name = "ddp"
    description = "DistributedDataParallel, one process per device (torchrun-style launcher)"
    options_section = "ddp"
    options_cls = DDPOptions
    options: DDPOptions
    strategy_facts = FACTS

    @override
    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer | None):
        model = self.place(model)
        # device_ids only for a module on one CUDA device; CPU modules and modules split
        # across devices (ToyMpModel) must leave it unset.
        on_one_cuda_device = (
            self.device.type == "cuda" and len({p.device for p in model.parameters()}) == 1
        )
        wrapped = DistributedDataParallel(
            model,
            device_ids=[self.device.index] if on_one_cuda_device else None,
            bucket_cap_mb=self.options.bucket_cap_mb,
            find_unused_parameters=self.options.find_unused_parameters,
            static_graph=self.options.static_graph,
            gradient_as_bucket_view=self.options.gradient_as_bucket_view,
            **buffer_sync(broadcast_buffers(model, self.options)),
        )
        register_comm_hook(wrapped, self.options)
        return wrapped, optimizer

    @override
    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    @override
    def no_sync(self, model: nn.Module):
        # Why: skipping the all-reduce on all but the last micro-batch is what makes
        # accumulation cost one synchronisation per optimizer step.
        return cast(DistributedDataParallel, model).no_sync()  # wrap made it one

    @property
    @override
    def library_world_size(self) -> int:
        return dist.world_size()  # DDP runs on torch.distributed's own group


def changing_buffers(model: nn.Module) -> list[str]:
    """Buffers training may change: the persistent ones (BatchNorm's running statistics, counters).
    Non-persistent buffers are constants a module derives from its configuration (position ids,
    masks)."""
    persistent = set(model.state_dict())
    return [name for name, _ in model.named_buffers() if name in persistent]


def broadcast_buffers(model: nn.Module, options: DDPOptions) -> bool:
    """Whether DDP should broadcast rank 0's buffers at every forward
    (``ddp.broadcast_buffers``)."""
    if options.broadcast_buffers == "auto":
        # Why: the broadcast is a blocking collective at the start of every forward; it only matters
        # for buffers that change (each rank's BatchNorm statistics would drift apart without it).
        return bool(changing_buffers(model))
    return options.broadcast_buffers == "always"


def buffer_sync(every_forward: bool) -> dict[str, Any]:
    """DDP's keyword for syncing rank 0's buffers at every forward: ``forward_sync_buffers`` where
    torch has it (torch 2.13 deprecates ``broadcast_buffers`` with a warning per rank),
    ``broadcast_buffers`` before."""
    if FORWARD_SYNC_BUFFERS:
        return {"forward_sync_buffers": every_forward}
    return {"broadcast_buffers": every_forward}


FORWARD_SYNC_BUFFERS = (
    "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
)
"""Whether this torch's DDP takes ``forward_sync_buffers`` (the buffers are then still synced once
at wrap time)."""


# no annotations: DDP checks them, and they are strings here
def bfloat16_average_hook(group, bucket):
    """Average a gradient bucket in bfloat16 (gloo reduces bf16; torch's hook allows NCCL only)."""
    group = group or torch_dist.group.WORLD
    gradients = bucket.buffer()
    compressed = gradients.to(torch.bfloat16).div_(group.size())
    # Why: the bucket's all-reduce is the gradient synchronisation; DDP waits on the returned
    # future.
    future = torch_dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(done: torch.futures.Future) -> torch.Tensor:
        gradients.copy_(done.value()[0])
        return gradients

    return future.then(decompress)


def register_comm_hook(model: DistributedDataParallel, options: DDPOptions) -> None:
    """Install the gradient communication hook ``options.comm_hook`` names (nothing for
    ``none``)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if options.comm_hook == "fp16_compress":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif options.comm_hook == "bf16_compress":
        nccl = torch_dist.get_backend() == "nccl"  # torch's own hook refuses every other backend
        model.register_comm_hook(
            None, default_hooks.bf16_compress_hook if nccl else bfloat16_average_hook
        )
    elif options.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=options.powersgd_rank,
            start_powerSGD_iter=options.powersgd_start_step,
            random_seed=0,
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


register_variant(
    "ddp-spawn",
    "ddp",
    {"launch.launcher": "spawn"},
    "DistributedDataParallel started by torch.multiprocessing spawn (mp.spawn)",
    # the same step as ddp's: planned when named; benched to compare the two launchers
    replace(
        FACTS,
        planned=False,
        about="the same started by torch.multiprocessing spawn",
        bench="quick",
        bench_rows=(),
    ),
)
