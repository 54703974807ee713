"""``accelerate``: HuggingFace ``Accelerator().prepare(model, optimizer)`` under rankwise's loop.

On a CPU-only machine the Accelerator must be created with ``cpu=True``: without it,
Accelerate 1.x reports ``DistributedType.NO`` under torchrun and every process silently
trains alone on all the data.  rankwise passes it and checks ``num_processes``.
Mixed precision is Accelerate's: it patches the model's forward with autocast and owns
the GradScaler (fp16), which checkpoints save and restore.  Evaluation is Accelerate's
too: its sharded loader and ``gather_for_metrics``, which drops the samples its last
batch repeats to keep the ranks even.  DDP options (``ddp.*``) reach the DDP wrapper
Accelerate creates.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from typing_extensions import override

from rankwise import dist
from rankwise.compat.accelerate_state import reset_accelerate_state
from rankwise.precision import Precision
from rankwise.strategies import register
from rankwise.strategies.base import Strategy, ready
from rankwise.strategies.ddp import ALL_REDUCE
from rankwise.strategies.facts import Facts
from rankwise.strategies.options import DDPOptions

INSTALL = "pip install 'rankwise[accelerate]'"
MIXED = {"32-true": "no", "bf16-mixed": "bf16", "16-mixed": "fp16"}


class AcceleratePrecision(Precision):
    """Accelerate's own mixed precision: autocast patched into the model's forward, its
    GradScaler."""

    def __init__(self, name: str, device: torch.device, strategy: Accelerate):
        super().__init__(name, device)
        self.scaler = None  # Accelerate creates and drives its own
        self.strategy = strategy

    @override
    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # prepare() wrapped the model's forward in autocast already

    @override
    def backward(self, loss: torch.Tensor) -> None:
        self.strategy.ready_accelerator.backward(loss)

    @override
    def unscale(self, optimizer) -> None:
        self.strategy.ready_accelerator.unscale_gradients(optimizer)

    @override
    def step(self, optimizer) -> None:
        optimizer.step()  # Accelerate's optimizer wrapper steps through its scaler

    @override
    def loss_scale(self) -> float:
        scaler = self.strategy.ready_accelerator.scaler
        return float(scaler.get_scale()) if scaler is not None else 1.0

    @override
    def state_dict(self) -> dict:
        scaler = self.strategy.ready_accelerator.scaler
        return {"scaler": scaler.state_dict()} if scaler is not None else {}

    @override
    def load_state_dict(self, state: dict) -> None:
        scaler = self.strategy.ready_accelerator.scaler
        if scaler is not None and "scaler" in state:
            scaler.load_state_dict(state["scaler"])


class AccelerateGather(dist.ExactGather):
    """Accelerate gathers each batch itself (``gather_for_metrics``) and drops its last batch's
    repeats."""

    def __init__(self, total: int, accelerator):
        super().__init__(total)
        self.accelerator = accelerator

    @override
    def add(self, index: torch.Tensor, *tensors: torch.Tensor) -> None:
        # Why: gather_for_metrics is a collective per batch; every rank needs every prediction.
        super().add(*self.accelerator.gather_for_metrics((index, *tensors)))

    @override
    def result(self) -> tuple[torch.Tensor, ...]:
        rows = self.local()
        if rows[0].numel() != self.total:  # the library's promise, checked
            raise RuntimeError(
                f"accelerate's gather_for_metrics returned {rows[0].numel()} rows for {self.total} "
                "samples"
            )
        return dist.exactly_once(*rows, total=self.total)


@register
class Accelerate(Strategy):
    name = "accelerate"
    description = "HuggingFace Accelerate (Accelerator.prepare), rankwise's loop"
    requires = ("accelerate",)
    install = INSTALL
    options_section = "ddp"
    options_cls = DDPOptions
    options: DDPOptions
    # Accelerator.prepare wraps the model in DDP: its step and memory are DDP's; planned when named
    strategy_facts = Facts(
        step=(ALL_REDUCE,),
        layout="reducer-buckets",
        planned=False,
        about="rankwise on Hugging Face Accelerate",
    )

    def __init__(self, *args, **kwargs):
        self.accelerator: Any = None
        super().__init__(*args, **kwargs)

    @property
    def ready_accelerator(self) -> Any:
        """The Accelerator ``wrap`` made (Accelerate ships no types: its calls are ``Any``)."""
        return ready(self.accelerator, "the Accelerator")

    @override
    def make_precision(self, name: str) -> Precision:
        return AcceleratePrecision(name, self.device, self)

    @override
    def setup_environment(self) -> None:
        try:
            from accelerate import Accelerator
            from accelerate.utils import DistributedDataParallelKwargs
        except ImportError as e:
            raise ImportError(f"strategy accelerate needs Accelerate: {INSTALL}  ({e})") from None
        super().setup_environment()  # Accelerate's state adopts the existing process group
        ddp = self.options
        ddp_kwargs = DistributedDataParallelKwargs(
            bucket_cap_mb=max(1, round(ddp.bucket_cap_mb)),
            find_unused_parameters=ddp.find_unused_parameters,
            static_graph=ddp.static_graph,
            gradient_as_bucket_view=ddp.gradient_as_bucket_view,
        )
        self.accelerator = Accelerator(
            cpu=self.device.type == "cpu",
            mixed_precision=MIXED[self.precision.name],
            kwargs_handlers=[ddp_kwargs],
        )

    @override
    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer | None):
        from torch.nn.parallel import DistributedDataParallel

        from rankwise.strategies.ddp import FORWARD_SYNC_BUFFERS, broadcast_buffers

        every_forward = broadcast_buffers(model, self.options)
        # Accelerate passes its handler's fields to DDP inside prepare()
        if not FORWARD_SYNC_BUFFERS:
            self.ready_accelerator.ddp_handler.broadcast_buffers = every_forward
        prepared = (
            self.ready_accelerator.prepare(model, optimizer)
            if optimizer is not None
            else (self.ready_accelerator.prepare(model), None)
        )
        if FORWARD_SYNC_BUFFERS and isinstance(prepared[0], DistributedDataParallel):
            # Left at its default (no deprecated keyword, no warning), then set as DDP itself would.
            prepared[0].forward_sync_buffers = every_forward
        return prepared

    @override
    def unwrap(self, model: nn.Module) -> nn.Module:
        return self.ready_accelerator.unwrap_model(model)

    @override
    def no_sync(self, model: nn.Module):
        # Why: skip DDP's all-reduce on all but the last micro-batch of an accumulation window.
        return self.ready_accelerator.no_sync(model)

    @override
    def step(self, optimizer, model: nn.Module, max_norm: float | None = None):
        norm = None
        if max_norm is not None:
            # unscales first (fp16)
            norm = self.ready_accelerator.clip_grad_norm_(model.parameters(), max_norm)
        self.precision.step(optimizer)
        return norm

    @override
    def eval_loader(
        self, dataset, per_rank_batch: int, collate_fn=None, order: list[int] | None = None
    ):
        from torch.utils.data import DataLoader

        # Accelerate shards the batches itself (rank r takes batches r, r+W, ...) and remembers how
        # many samples the last round really holds; rankwise moves each batch to the device.
        loader = DataLoader(
            dataset, batch_size=per_rank_batch, sampler=order, shuffle=False, collate_fn=collate_fn
        )
        return self.ready_accelerator.prepare_data_loader(loader, device_placement=False)

    @override
    def eval_gatherer(self, total: int) -> dist.ExactGather:
        return AccelerateGather(total, self.accelerator)

    @property
    @override
    def library_world_size(self) -> int:
        return self.ready_accelerator.num_processes

    @override
    def teardown(self, clean: bool = True) -> None:
        if self.accelerator is not None:
            self.accelerator.free_memory()
            self.accelerator = None
        super().teardown(clean)
        # a later setup() in this process (a notebook, a second run) starts afresh
        reset_accelerate_state()
