"""``horovod``: ``horovod.torch`` with its gloo controller, started by ``horovodrun --gloo``.

Gradients are averaged by Horovod's ``DistributedOptimizer`` (optional fp16
compression on the wire); parameters and optimizer state are broadcast from rank 0;
gradient accumulation is Horovod's ``backward_passes_per_step``.  rankwise's own
collectives (loss logging, exact evaluation gather) use a torch gloo group created
alongside, so evaluation counts every sample exactly once here too.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from typing_extensions import override

from rankwise.strategies import register
from rankwise.strategies.base import Strategy, ready
from rankwise.strategies.facts import Facts, StepCall
from rankwise.strategies.options import HorovodOptions

INSTALL = (
    "pip install 'rankwise[horovod]' (Horovod 0.28.1 must be built for torch 2.x: "
    "scripts/build_horovod.sh)"
)

FUSION_BYTES = 128 * 2**20
"""Horovod's fusion buffer, ``HOROVOD_FUSION_THRESHOLD``'s default."""


def import_horovod():
    try:
        import horovod.torch as hvd
    except ImportError as e:
        raise ImportError(f"strategy horovod needs Horovod: {INSTALL}  ({e})") from None
    return hvd


@register
class Horovod(Strategy):
    name = "horovod"
    description = "Horovod DistributedOptimizer over gloo (started with horovodrun --gloo)"
    requires = ("horovod.torch",)
    install = INSTALL
    launcher = "horovodrun"
    options_section = "horovod"
    options_cls = HorovodOptions
    options: HorovodOptions
    strategy_facts = Facts(
        step=(
            StepCall(
                "all_reduce",
                "gradients",
                "buckets",
                "backward",
                "gradients",
                # DistributedOptimizer's hooks start each gradient's all-reduce as it is ready;
                # the background thread fuses them up to HOROVOD_FUSION_THRESHOLD (128 MiB)
                bucket=FUSION_BYTES,
            ),
        ),
        layout="fusion-buffer",
        planned=False,  # its fusion buffer is outside torch: planned when named
        about="Horovod under horovodrun",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hvd = None

    @override
    def setup_environment(self) -> None:
        self.hvd = import_horovod()
        self.hvd.init()
        super().setup_environment()

    @override
    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer | None):
        hvd = ready(self.hvd, "Horovod")
        model = model.to(self.device)
        # Why: every rank must start from rank 0's weights and optimizer state.
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        if optimizer is None:
            return model, None
        if optimizer.state:
            # Why: state loaded on rank 0 only (a user's resume) must reach every rank.  A fresh
            # optimizer is skipped: Horovod would first fill its state with a real step on zero
            # gradients, and AdamW's decoupled weight decay would shrink every weight once.
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        compression = (
            hvd.Compression.fp16 if self.options.fp16_compression else hvd.Compression.none
        )
        # Horovod counts backward passes itself and reduces on the last of each step's grad_accum.
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=compression,
            op=hvd.Average,
            backward_passes_per_step=self.facts.grad_accum,
        )
        return model, optimizer

    @override
    def unwrap(self, model: nn.Module) -> nn.Module:
        return model  # Horovod wraps the optimizer, not the module

    @override
    def no_sync(self, model: nn.Module):
        # Horovod counts backward passes itself (backward_passes_per_step) and reduces on the last;
        # it can only do so when prepare() was told how many micro-batches a step has.
        if self.facts.grad_accum == 1:
            raise RuntimeError(
                "strategy horovod: accumulating gradients needs the number of micro-batches per "
                "step up front: rt.prepare(model, optimizer, grad_accum=N)"
            )
        return contextlib.nullcontext()

    @override
    def step(self, optimizer, model: nn.Module, max_norm: float | None = None):
        # Why: wait for the averaged gradients here, not inside step(): clipping needs every rank's
        # gradients, and a GradScaler (fp16) reads them to unscale and check for overflow before
        # stepping.
        optimizer.synchronize()
        norm = None
        if max_norm is not None:
            self.precision.unscale(optimizer)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        with optimizer.skip_synchronize():
            self.precision.step(optimizer)
        return norm

    @override
    def zero_grad(self, optimizer) -> None:
        # Horovod's wrapper takes no set_to_none (torch's default is already True)
        optimizer.zero_grad()

    @property
    @override
    def library_world_size(self) -> int:
        return ready(self.hvd, "Horovod").size()

    @override
    def teardown(self, clean: bool = True) -> None:
        super().teardown(clean)
        if self.hvd is not None:
            self.hvd.shutdown()
