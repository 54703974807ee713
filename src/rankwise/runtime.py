"""The public API for your own training loop.

A single-device script becomes distributed by changing a few lines::

    import rankwise

    with rankwise.setup(strategy="ddp", precision="32-true", seed=0) as rt:
        model, optimizer = rt.prepare(model, optimizer)
        loader = rt.loader(train_set, batch_size=64, shuffle=True)        # global batch
        for epoch in range(epochs):
            rt.set_epoch(loader, epoch)
            for batch in loader:
                batch = rt.to_device(batch)
                with rt.autocast():
                    loss = loss_fn(model(batch["x"]), batch["y"])
                rt.backward(loss, model)
                rt.clip_grad_norm(model, optimizer, 1.0)
                rt.step(optimizer, model)
                rt.zero_grad(optimizer)
        rt.print("mean loss", rt.all_reduce(loss.detach(), "mean").item())
        rt.save_weights(model, "model.safetensors")

and is started with ``rankwise launch --nproc-per-node 2 script.py``.  The built-in
``rankwise train`` command is written on this same API (``rankwise.loop``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from rankwise import dist
from rankwise.data.sampler import LengthGroupedSampler
from rankwise.env import ProcessEnv
from rankwise.strategies import Strategy, get_strategy

if TYPE_CHECKING:
    from rankwise.config import TrainConfig


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Runtime:
    """One process's view of a distributed run: its strategy, device, rank and collectives."""

    def __init__(self, strategy: str = "single", precision: str = "32-true", *, seed: int | None = 0,
                 config: "TrainConfig | None" = None, timeout_s: float = 300.0, env: ProcessEnv | None = None):
        self.env = env or ProcessEnv.detect()
        strategy_cls = get_strategy(strategy)
        strategy_cls.check_available()
        if not strategy_cls.multiprocess and self.env.distributed:
            raise RuntimeError(
                f"strategy {strategy!r} runs in one process, but this process was launched as rank "
                f"{self.env.rank} of {self.env.world_size}; use a multi-process strategy such as ddp"
            )
        self.strategy: Strategy = strategy_cls(self.env, precision, config, timeout_s)
        self.strategy.setup_environment()
        if self.strategy.multiprocess and self.env.distributed and self.strategy.library_world_size != self.env.world_size:
            seen = self.strategy.library_world_size
            self.strategy.teardown(clean=False)  # the group was joined: leave it before refusing
            raise RuntimeError(
                f"rank {self.rank}: the {strategy} library sees world size {seen}, "
                f"the launcher started {self.env.world_size} processes: each process would train alone"
            )
        self.seed = seed
        if seed is not None:
            seed_everything(seed)
        self._prepared: list[nn.Module] = []
        self._closed = False

    # -- identity ----------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.is_main

    @property
    def device(self) -> torch.device:
        return self.strategy.device

    def print(self, *args, **kwargs) -> None:
        """``print`` on rank 0 only."""
        if self.is_main:
            print(*args, **kwargs, flush=True)

    # -- model, optimizer, data --------------------------------------------------------------
    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None):
        """Move and wrap the model for the strategy; returns ``(model, optimizer)``.

        Build the optimizer on the *unwrapped* model's parameters before calling this
        (the same code as a single-device script).
        """
        wrapped, optimizer = self.strategy.setup(model, optimizer)
        self._prepared.append(wrapped)
        return wrapped, optimizer

    def unwrap(self, model: nn.Module) -> nn.Module:
        return self.strategy.unwrap(model)

    def loader(self, dataset: Dataset, batch_size: int, *, shuffle: bool = True, drop_last: bool | None = None,
               seed: int | None = None, collate_fn=None, num_workers: int = 0,
               lengths: Sequence[int] | None = None, group_size: int | None = None) -> DataLoader:
        """A DataLoader over this rank's shard; ``batch_size`` is the *global* batch.

        Training loaders (``shuffle=True``) drop the last incomplete global batch, so each
        step's per-rank batches together are exactly one batch of a single-process run
        with the same seed.  Evaluation loaders (``shuffle=False``) keep every sample;
        the sampler pads the last shard, and :meth:`gather_exact` removes the padding.

        ``lengths`` (one per sample, shuffled loaders only) groups samples of similar
        length into the same global batch, so padding to the batch's longest costs little.
        Under gradient accumulation pass the optimizer step's global batch as
        ``group_size`` so each step, not each micro-batch, is one length group.
        """
        if batch_size % self.world_size:
            raise ValueError(f"global batch {batch_size} is not divisible by world size {self.world_size}")
        drop_last = shuffle if drop_last is None else drop_last
        if seed is None:
            seed = self.seed or 0
        if lengths is not None:
            if not (shuffle and drop_last):
                raise ValueError("lengths group a shuffled training loader (shuffle=True, drop_last=True)")
            group_size = group_size or batch_size
            if group_size % batch_size:
                raise ValueError(f"group_size {group_size} is not a multiple of the batch size {batch_size}")
            sampler = LengthGroupedSampler(dataset, lengths, group_size, num_replicas=self.world_size, rank=self.rank,
                                           seed=seed)
        else:
            sampler = DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank, shuffle=shuffle,
                                         seed=seed, drop_last=drop_last)
        per_rank = batch_size // self.world_size
        if drop_last and len(sampler) < per_rank:
            raise ValueError(
                f"the dataset has {len(dataset)} samples: too few for one global batch of {batch_size} "
                f"over {self.world_size} ranks; lower the batch size or the number of processes"
            )
        # A private generator: iterating the loader must not consume the global RNG (dropout's),
        # or a resumed run would draw different dropout masks than an uninterrupted one.
        return DataLoader(dataset, batch_size=per_rank, sampler=sampler, drop_last=drop_last,
                          collate_fn=collate_fn, num_workers=num_workers, pin_memory=self.device.type == "cuda",
                          generator=torch.Generator().manual_seed(seed))

    @staticmethod
    def set_epoch(loader: DataLoader, epoch: int) -> None:
        """Reshuffle for a new epoch: the same permutation on every rank, a new one each epoch."""
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)

    def to_device(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, dict):
            return {k: self.to_device(v) for k, v in batch.items()}
        if isinstance(batch, (list, tuple)):
            return type(batch)(self.to_device(v) for v in batch)
        return batch

    # -- the step ----------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager:
        return self.strategy.precision.autocast()

    def no_sync(self, model: nn.Module, enabled: bool = True) -> contextlib.AbstractContextManager:
        """Skip gradient synchronisation while ``enabled`` (all micro-batches but the last)."""
        return self.strategy.no_sync(model) if enabled else contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, model: nn.Module) -> None:
        self.strategy.backward(loss, model)

    def clip_grad_norm(self, model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
        return self.strategy.clip_grad_norm(model, optimizer, max_norm)

    def step(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
        self.strategy.optimizer_step(optimizer, model)

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Drop gradients (set to None) after a step."""
        self.strategy.zero_grad(optimizer)

    # -- collectives -------------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp = "mean") -> torch.Tensor:
        return dist.all_reduce(tensor, op)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return dist.all_gather(tensor)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite ``tensor`` in place with rank ``src``'s values and return it."""
        return dist.broadcast(tensor, src)

    def gather_exact(self, index: torch.Tensor, *tensors: torch.Tensor, total: int):
        return dist.gather_exact(index, *tensors, total=total)

    def all_gather_object(self, obj) -> list:
        return dist.all_gather_object(obj)

    def broadcast_object(self, obj, src: int = 0):
        return dist.broadcast_object(obj, src)

    def barrier(self) -> None:
        dist.barrier()

    # -- weights -----------------------------------------------------------------------------
    def state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Full unwrapped weights on the CPU.  Sharded strategies (fsdp, deepspeed ZeRO-3) gather them
        collectively, so call it on every rank; they return them on rank 0 only (others get ``{}``)."""
        return self.strategy.model_state_dict(model)

    def save_weights(self, model: nn.Module, path: str | os.PathLike) -> None:
        """Write unwrapped weights as safetensors, atomically, from rank 0 (call on every rank)."""
        from rankwise.checkpoint import write_weights

        state = self.state_dict(model)
        if self.is_main:
            write_weights(state, path)
        # Why: other ranks must not read the file, or exit, before rank 0 finished writing it.
        self.barrier()

    def load_weights(self, model: nn.Module, path: str | os.PathLike) -> None:
        from rankwise.checkpoint import read_weights

        self.strategy.load_model_state_dict(model, read_weights(path))

    # -- teardown ----------------------------------------------------------------------------
    def teardown(self, clean: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        # Wrapped modules must be gone before the process group is destroyed (see env.destroy_process_group).
        self._prepared.clear()
        gc.collect()
        self.strategy.teardown(clean)

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.teardown(clean=exc_type is None)


def setup(strategy: str = "single", precision: str = "32-true", **kwargs) -> Runtime:
    """Create the :class:`Runtime` for this process (joins the process group when launched with several)."""
    return Runtime(strategy, precision, **kwargs)


def iterate_steps(loader: Iterable, grad_accum: int):
    """Yield ``(micro_index, is_last_micro, batch)`` for whole optimizer steps only.

    Micro-batches left over at the end of an epoch (fewer than ``grad_accum``) are
    skipped, so every optimizer step averages the same number of samples.
    """
    steps = len(loader) // grad_accum
    for i, batch in enumerate(loader):
        if i >= steps * grad_accum:
            break
        yield i, (i + 1) % grad_accum == 0, batch
