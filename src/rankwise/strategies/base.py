"""The small interface every strategy implements.

A strategy decides how a model and optimizer are wrapped, how the backward pass and
the optimizer step run, and how gradient synchronisation is skipped during
accumulation.  It never starts processes (that is ``rankwise.launch``) and never
contains the training loop (that is ``rankwise.loop``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from rankwise import env as process
from rankwise.env import ProcessEnv
from rankwise.precision import Precision

if TYPE_CHECKING:
    from rankwise.config import TrainConfig


class Strategy:
    name: ClassVar[str]
    """Name used with ``--strategy``."""
    multiprocess: ClassVar[bool] = True
    """Whether the strategy runs one process per device (and so needs a launcher)."""
    description: ClassVar[str] = ""
    """One line for ``--help``."""
    launcher: ClassVar[str | None] = None
    """A launcher the strategy needs (e.g. horovodrun), overriding launch.launcher."""
    sharded_state: ClassVar[bool] = False
    """Whether model/optimizer state is split across ranks and saved by every rank (FSDP, DeepSpeed)."""
    requires: ClassVar[tuple[str, ...]] = ()
    """Importable modules the strategy needs beyond torch."""
    install: ClassVar[str] = ""
    """The command that installs them."""

    @classmethod
    def check_available(cls) -> None:
        """Raise ImportError with the install command when a required library is missing."""
        import importlib.util

        for module in cls.requires:
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                raise ImportError(f"strategy {cls.name!r} needs the {module.split('.')[0]} library: {cls.install}")

    @classmethod
    def check_config(cls, cfg: "TrainConfig") -> None:
        """Raise ConfigError for settings this strategy cannot run (called before any worker starts)."""

    def __init__(self, env: ProcessEnv, precision: str = "32-true", config: "TrainConfig | None" = None,
                 timeout_s: float = 300.0):
        from rankwise.config import TrainConfig

        self.env = env
        self.config = config or TrainConfig(strategy=self.name, precision=precision)
        """The run's configuration: each strategy reads its own section (``ddp``, ``deepspeed``, ...)."""
        self.timeout_s = timeout_s
        self.device = process.device_for(env.local_rank)
        self.precision = Precision(precision, self.device)

    # -- lifecycle ---------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Join the process group (multi-process strategies)."""
        process.init_process_group(self.env, self.device, self.timeout_s)

    def teardown(self, clean: bool = True) -> None:
        process.destroy_process_group(clean)

    # -- wrapping ----------------------------------------------------------------------------
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer | None):
        """Wrap model and optimizer together (strategies such as FSDP and DeepSpeed need both at once)."""
        model = self.setup_module(model)
        return model, (self.setup_optimizer(optimizer) if optimizer is not None else None)

    def setup_module(self, model: nn.Module) -> nn.Module:
        if len({p.device for p in model.parameters()}) > 1:
            return model  # already placed across devices by its builder (model.split_devices)
        return model.to(self.device)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return optimizer

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    # -- the step ----------------------------------------------------------------------------
    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Context in which backward passes do not synchronise gradients (accumulation)."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, model: nn.Module) -> None:
        self.precision.backward(loss)

    def clip_grad_norm(self, model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
        self.precision.unscale(optimizer)
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
        self.precision.step(optimizer)

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)

    # -- evaluation --------------------------------------------------------------------------
    gathers_for_metrics: ClassVar[bool] = False
    """Whether the library shards evaluation batches and gathers each one itself (Accelerate's
    ``gather_for_metrics``); otherwise rankwise shards with a sampler and gathers once at the end."""

    def evaluation_loader(self, dataset, per_rank_batch: int, collate_fn=None):
        """The library's sharded evaluation loader (only when ``gathers_for_metrics``)."""
        raise NotImplementedError(f"strategy {self.name} evaluates with rankwise's sampler")

    def gather_for_metrics(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One evaluation batch's per-sample tensors from every rank, padding dropped (only when ``gathers_for_metrics``)."""
        raise NotImplementedError(f"strategy {self.name} evaluates with rankwise's sampler")

    # -- state -------------------------------------------------------------------------------
    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Full, unwrapped weights (no ``module.`` prefix), on the CPU."""
        return {k: v.detach().cpu() for k, v in self.unwrap(model).state_dict().items()}

    def load_model_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        self.unwrap(model).load_state_dict(state)

    def save_sharded_state(self, directory: Path, model: nn.Module, optimizer) -> None:
        """Write this rank's share of model and optimizer state into ``directory`` (every rank calls it)."""
        raise NotImplementedError(f"strategy {self.name} keeps full state on rank 0")

    def load_sharded_state(self, directory: Path, model: nn.Module, optimizer) -> None:
        raise NotImplementedError(f"strategy {self.name} keeps full state on rank 0")

    @property
    def library_world_size(self) -> int:
        """World size as the strategy's own library sees it (guards against ranks training alone)."""
        from rankwise import dist

        return dist.world_size()
