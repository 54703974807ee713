"""``accelerate``: HuggingFace ``Accelerator().prepare(model, optimizer)`` under rankwise's loop.

On a CPU-only machine the Accelerator must be created with ``cpu=True``: without it,
Accelerate 1.x reports ``DistributedType.NO`` under torchrun and every process silently
trains alone on all the data.  rankwise passes it and checks ``num_processes``.
Mixed precision is Accelerate's (it patches the model's forward with autocast).
Evaluation is Accelerate's too: its sharded loader and ``gather_for_metrics``, which drops
the samples its last batch repeats to keep the ranks even.
"""

from __future__ import annotations

import torch
from torch import nn

from rankwise.precision import Precision
from rankwise.strategies import register
from rankwise.strategies.base import Strategy

INSTALL = "pip install 'rankwise[accelerate]'"
MIXED = {"32-true": "no", "bf16-mixed": "bf16", "16-mixed": "fp16"}


@register
class Accelerate(Strategy):
    name = "accelerate"
    description = "HuggingFace Accelerate (Accelerator.prepare), rankwise's loop"
    requires = ("accelerate",)
    install = INSTALL

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mixed_precision = MIXED[self.precision.name]
        self.precision = Precision("32-true", self.device)  # Accelerate applies autocast itself
        self.accelerator = None

    def setup_environment(self) -> None:
        try:
            from accelerate import Accelerator
            from accelerate.utils import DistributedDataParallelKwargs
        except ImportError as e:
            raise ImportError(f"strategy accelerate needs Accelerate: {INSTALL}  ({e})") from None
        super().setup_environment()  # Accelerate's state adopts the existing process group
        ddp = self.config.ddp
        # Our DDP settings reach the DDP wrapper Accelerate creates.
        ddp_kwargs = DistributedDataParallelKwargs(
            bucket_cap_mb=max(1, round(ddp.bucket_cap_mb)), find_unused_parameters=ddp.find_unused_parameters,
            static_graph=ddp.static_graph, gradient_as_bucket_view=ddp.gradient_as_bucket_view)
        self.accelerator = Accelerator(cpu=self.device.type == "cpu", mixed_precision=self.mixed_precision,
                                       kwargs_handlers=[ddp_kwargs])

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer | None):
        if optimizer is None:
            return self.accelerator.prepare(model), None
        return self.accelerator.prepare(model, optimizer)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return self.accelerator.unwrap_model(model)

    def no_sync(self, model: nn.Module):
        # Why: skip DDP's all-reduce on all but the last micro-batch of an accumulation window.
        return self.accelerator.no_sync(model)

    def backward(self, loss: torch.Tensor, model: nn.Module) -> None:
        self.accelerator.backward(loss)

    def clip_grad_norm(self, model: nn.Module, optimizer, max_norm: float):
        return self.accelerator.clip_grad_norm_(model.parameters(), max_norm)

    def optimizer_step(self, optimizer, model: nn.Module) -> None:
        optimizer.step()

    gathers_for_metrics = True

    def evaluation_loader(self, dataset, per_rank_batch: int, collate_fn=None):
        from torch.utils.data import DataLoader

        # Accelerate shards the batches itself (rank r takes batches r, r+W, ...) and remembers how
        # many samples the last round really holds; rankwise moves each batch to the device.
        loader = DataLoader(dataset, batch_size=per_rank_batch, shuffle=False, collate_fn=collate_fn)
        return self.accelerator.prepare_data_loader(loader, device_placement=False)

    def gather_for_metrics(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Why: every rank needs every prediction; Accelerate truncates the last round's repeats.
        return tuple(self.accelerator.gather_for_metrics(tensors))

    @property
    def library_world_size(self) -> int:
        return self.accelerator.num_processes

    def teardown(self, clean: bool = True) -> None:
        if self.accelerator is not None:
            self.accelerator.free_memory()
            self.accelerator = None
        super().teardown(clean)
        # Accelerate keeps process-wide singletons that outlive the process group; clear them
        # so a later setup() in this process (a notebook, a second run) starts afresh.
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
