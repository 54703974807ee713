"""The public API for your own training loop.

A single-device script becomes distributed by changing a few lines::

    import rankwise

    with rankwise.setup(seed=0) as rt:          # the strategy: rankwise launch --strategy NAME
        model = build_model()                   # after setup: every rank seeded alike
        optimizer = torch.optim.AdamW(model.parameters())
        model, optimizer = rt.prepare(model, optimizer, grad_accum=2)
        loader = rt.loader(train_set, batch_size=64, shuffle=True)        # global batch
        if resuming:
            extra = rt.load_state("ckpt", model, optimizer, scheduler)    # every rank, any strategy
        for epoch in range(epochs):
            rt.set_epoch(loader, epoch)
            for micro, last, batch in rankwise.iterate_steps(loader, grad_accum=2):
                batch = rt.to_device(batch)
                with rt.no_sync(model, enabled=not last):    # forward and backward inside
                    with rt.autocast():
                        loss = loss_fn(model(batch["x"]), batch["y"])
                    rt.backward(loss / 2, model)
                if last:
                    # clip + step; returns the global norm before clipping
                    norm = rt.step(optimizer, model, max_norm=1.0)
                    rt.zero_grad(optimizer)
            rt.save_state("ckpt", model, optimizer, scheduler, extra={"epoch": epoch})
        rt.print("mean loss", rt.all_reduce(loss.detach(), "mean").item())
        rt.save_weights(model, "model.safetensors")

and is started with ``rankwise launch --nproc-per-node 2 script.py``.  The built-in
``rankwise train`` command is written on this same API (``rankwise.train.loop``).

Every call behaves the same under every strategy: ``save_state`` / ``load_state``
decide themselves whether state is whole on rank 0 or sharded (FSDP, DeepSpeed);
``eval_loader`` / ``eval_gatherer`` shard evaluation and gather each sample exactly
once (Accelerate through its own ``gather_for_metrics``).
"""

from __future__ import annotations

import contextlib
import os
import random
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from rankwise import checkpoint as ckpt
from rankwise import dist
from rankwise.checkpoint import resume
from rankwise.checkpoint.position import ResumableLoader
from rankwise.launch.choice import settle
from rankwise.launch.failures import record_for_launcher
from rankwise.process import ProcessEnv
from rankwise.runtime import hangs, observers
from rankwise.runtime.agreement import agree_with_rank0
from rankwise.runtime.data import Sampling, shard_loader
from rankwise.runtime.data_shares import DataSharesCheck
from rankwise.runtime.prefetch import DeviceAhead
from rankwise.sampling.batching import (
    dataset_size,
    longest_first,
    micro_batch_size,
)
from rankwise.strategies import LoopFacts, Strategy, check_world_size, lookup, resolve_options
from rankwise.strategies.options import Options


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Runtime:
    """One process's view of a distributed run: its strategy, device, rank and collectives."""

    def __init__(
        self,
        strategy: str | None = None,
        precision: str | None = None,
        *,
        seed: int | None = 0,
        options: Options | Mapping[str, Any] | None = None,
        timeout_s: float = 300.0,
        env: ProcessEnv | None = None,
    ):
        """``strategy`` / ``precision``: when not given, what ``rankwise launch --strategy /
        --precision`` chose, else ``ddp`` for one of several processes (``single`` alone) and
        ``32-true``. ``options``: the strategy's own section (e.g. ``{"zero_stage": 3}`` for
        deepspeed), merged with the launcher's ``--set``; a variant's fixed settings
        (``deepspeed-zero3``) apply on top and must not be contradicted."""
        self.env = env or ProcessEnv.detect()
        strategy, precision, options = settle(strategy, precision, options, self.env.world_size)
        variant = lookup(strategy)
        strategy_cls = variant.cls
        strategy_cls.check_available()
        check_world_size(variant, self.env.world_size)
        self.strategy: Strategy = strategy_cls(
            self.env, precision, resolve_options(variant, options), timeout_s
        )
        self.strategy_name = strategy
        self.strategy.setup_environment()
        seen = (
            self.strategy.library_world_size
            if self.strategy.multiprocess and self.env.distributed
            else None
        )
        if seen is not None and seen != self.env.world_size:
            self.strategy.teardown(clean=False)  # the group was joined: leave it before refusing
            raise RuntimeError(
                f"rank {self.rank}: the {strategy} library sees world size {seen}, the launcher "
                f"started {self.env.world_size} processes: each process would train alone"
            )
        # which node and address each rank runs on, should it later go silent
        hangs.announce(self.env)
        self.seed = seed
        if seed is not None:
            seed_everything(seed)
        self._data_shares = DataSharesCheck(self.env.world_size)
        self.prefetch = DeviceAhead(self.device, say=self.print)  # rt.loader's, to the device
        self.observers = observers.registered()
        """What a tool watches in this run (``rankwise verify``, ``bench --script``); empty
        otherwise."""
        self.steps = 0
        """Optimizer steps taken through :meth:`step` (restored by :meth:`load_state`)."""
        self._prepared: list[nn.Module] = []
        self._stepped_by_clip: torch.optim.Optimizer | None = None
        self._closed = False
        self._grad_accum = 1
        self._loaders: list[weakref.ref[ResumableLoader]] = []
        self._positions: list[dict] = []
        """Loader positions a checkpoint holds for loaders not built yet (rt.load_state before
        rt.loader)."""

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
        """``print`` on rank 0 only: your script's own output.  rankwise's messages go through
        :mod:`logging` instead (``logging.getLogger("rankwise")``, rank-aware:
        :mod:`rankwise.logs`)."""
        if self.is_main:
            print(*args, **kwargs, flush=True)

    # -- model, optimizer, data --------------------------------------------------------------
    def prepare(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        grad_accum: int = 1,
        micro_batch_size: int | None = None,
        compile: bool = False,
        activation_checkpointing: bool = False,
    ):
        """Move and wrap the model for the strategy; returns ``(model, optimizer)``.  Every rank
        starts from rank 0's weights and buffers (:mod:`rankwise.runtime.agreement`; rank 0 warns
        once where a rank had built others).

        Build the optimizer on the *unwrapped* model's parameters before calling this (the same code
        as a single-device script).  ``grad_accum``: micro-batches per optimizer step, when the loop
        accumulates (Horovod and DeepSpeed must know it up front); ``micro_batch_size``: samples per
        rank per micro-batch, if known. ``compile``: ``torch.compile`` the model's forward in place,
        inside the strategy's wrapping (inside DDP's forward, after FSDP's sharding, with
        DeepSpeed's engine; refused under ``dp``); the first steps then pay for the compilation.
        ``activation_checkpointing``: recompute each transformer layer's activations in the backward
        pass (see :mod:`rankwise.strategies.blocks` for how layers are found).
        """
        if grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {grad_accum}")
        facts = LoopFacts(
            grad_accum=grad_accum,
            micro_batch_size=micro_batch_size,
            compile=compile,
            activation_checkpointing=activation_checkpointing,
        )
        for observer in self.observers:
            observer.prepared(self, model, grad_accum)
        if self.strategy.multiprocess:
            agree_with_rank0(model, self.device)
        wrapped, optimizer = self.strategy.setup(model, optimizer, facts)
        self._prepared.append(wrapped)
        self._grad_accum = grad_accum
        return wrapped, optimizer

    def loader(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool | None = None,
        seed: int | None = None,
        collate_fn=None,
        num_workers: int = 0,
        lengths: Sequence[int] | None = None,
        group_size: int | None = None,
        prefetch: bool | None = None,
    ) -> ResumableLoader:
        """A DataLoader over this rank's shard; ``batch_size`` is the *global* batch.

        Training loaders (``shuffle=True``) drop the last incomplete global batch, so each
        step's per-rank batches together are exactly one batch of a single-process run
        with the same seed.  Evaluation loaders (``shuffle=False``) keep every sample;
        the sampler pads the last shard, and :meth:`gather_exact` removes the padding.

        ``lengths`` (one per sample, shuffled loaders only) groups samples of similar
        length into the same global batch, so padding to the batch's longest costs little.
        Under gradient accumulation pass the optimizer step's global batch as
        ``group_size`` so each step, not each micro-batch, is one length group.
        ``prefetch`` (default: on a CUDA device): each batch handed out starts the next one's copy
        to the device, which :meth:`to_device` then takes (:mod:`rankwise.runtime.prefetch`)."""
        micro_batch_size(batch_size, self.world_size)
        drop_last = shuffle if drop_last is None else drop_last
        for observer in self.observers:
            observer.loader(self, batch_size, shuffle)
        sampling = Sampling(
            batch_size, shuffle, drop_last, self.seed or 0 if seed is None else seed
        )
        loader = shard_loader(
            self,
            dataset,
            sampling,
            collate_fn=collate_fn,
            num_workers=num_workers,
            lengths=lengths,
            group_size=group_size,
            prefetch=prefetch,
            name=f"rt.loader #{len(self._loaders) + 1}" if self._loaders else "rt.loader",
        )
        self._loaders.append(weakref.ref(loader))
        if self._positions:  # load_state ran before this loader was built: it continues too
            self._resume_loader(loader, self._positions.pop(0))
        return loader

    @staticmethod
    def set_epoch(loader: DataLoader, epoch: int) -> None:
        """Reshuffle for a new epoch: the same permutation on every rank, a new one each epoch."""
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)

    def to_device(self, batch: Any) -> Any:
        """Tensors of ``batch`` (nested in dicts, lists and tuples) on this rank's device."""
        for observer in self.observers:
            observer.batch(self, batch)
        if self._data_shares.pending:
            self._data_shares.batch(batch)
        return self.prefetch.move(batch)  # the copies rt.loader made ahead, where it made some

    # -- evaluation --------------------------------------------------------------------------
    def eval_loader(
        self,
        dataset: Dataset,
        per_rank_batch: int,
        collate_fn=None,
        *,
        lengths: Sequence[int] | None = None,
    ) -> Iterable:
        """This rank's share of an evaluation set, as the strategy shards it; feed each batch's
        per-sample outputs to an :meth:`eval_gatherer`, which returns them in index order.
        ``lengths`` (one per sample): evaluate the longest first, so a batch padded to its longest
        pads little."""
        if lengths is not None and len(lengths) != dataset_size(dataset):
            raise ValueError(
                f"{len(lengths)} lengths for an evaluation set of {dataset_size(dataset)} samples"
            )
        order = longest_first(lengths) if lengths is not None else None
        return self.strategy.eval_loader(dataset, per_rank_batch, collate_fn, order)

    def eval_gatherer(self, total: int) -> dist.ExactGather:
        """``g.add(index, *per_sample_tensors)`` per batch, then ``g.result()`` on every rank:
        ``(index, *tensors)`` with each of the ``total`` samples exactly once, in index order."""
        return self.strategy.eval_gatherer(total)

    # -- the step ----------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager:
        return self.strategy.precision.autocast()

    def no_sync(self, model: nn.Module, enabled: bool = True) -> contextlib.AbstractContextManager:
        """Skip gradient synchronisation while ``enabled`` (all micro-batches but the last)."""
        return self.strategy.no_sync(model) if enabled else contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, model: nn.Module) -> None:
        for observer in self.observers:
            observer.backward(self, loss)
        self.strategy.backward(loss, model)

    def step(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, max_norm: float | None = None
    ) -> torch.Tensor | None:
        """Take one optimizer step on the gradients of every rank, first clipping their global norm
        to ``max_norm`` when given; returns that norm before clipping (the same on every rank and
        under every strategy), or ``None`` without clipping.  Clip and step are one call because
        some strategies (DeepSpeed ZeRO) can only clip inside their step."""
        if self._stepped_by_clip is optimizer:  # clip_grad_norm already took this step
            self._stepped_by_clip = None
            if max_norm is not None:
                raise RuntimeError(
                    "rt.clip_grad_norm already clipped and took this step; call rt.step without "
                    "max_norm after it, or only rt.step(optimizer, model, max_norm=...)"
                )
            norm = None
        else:
            norm = self._take_step(optimizer, model, max_norm)
        self.steps += 1
        # once, at the first step: did every rank train on its own share?
        self._data_shares.stepped()
        for loader in self.loaders():
            if loader.resumed is not None:  # the first step after a resume: did the data continue?
                loader.check_first_step(self._grad_accum, self.strategy_name)
        for observer in self.observers:
            observer.stepped(self, model)
        return norm

    def clip_grad_norm(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float
    ) -> torch.Tensor:
        """The older spelling of ``rt.step(optimizer, model, max_norm)``: clips to ``max_norm`` and
        takes the optimizer step right away, returning the global norm before clipping; the
        :meth:`step` that follows in the loop then only counts the step."""
        norm = self._take_step(optimizer, model, max_norm)
        self._stepped_by_clip = optimizer
        return norm

    def _take_step(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, max_norm: float | None
    ):
        for observer in self.observers:
            observer.before_step(self, model, optimizer)
        return self.strategy.step(optimizer, model, max_norm)

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
        """Full unwrapped weights on the CPU.  Sharded strategies (fsdp, deepspeed ZeRO-3) gather
        them collectively, so call it on every rank; they return them on rank 0 only (others get
        ``{}``)."""
        return self.strategy.model_state_dict(model)

    def save_weights(self, model: nn.Module, path: str | os.PathLike) -> None:
        """Write unwrapped weights as safetensors, atomically, from rank 0 (call on every rank)."""
        weights = self.state_dict(model)
        if self.is_main:
            ckpt.write_weights(weights, path)
        # Why: other ranks must not read the file, or exit, before rank 0 finished writing it.
        self.barrier()

    def load_weights(self, model: nn.Module, path: str | os.PathLike) -> None:
        self.strategy.load_model_state_dict(model, ckpt.read_weights(path))

    # -- training state ----------------------------------------------------------------------
    def save_state(
        self,
        directory: str | os.PathLike,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        scheduler=None,
        extra: dict | None = None,
        *,
        step: int | None = None,
        files: Mapping[str, str | os.PathLike | bytes] | None = None,
        keep: int = 2,
        meta: Mapping | None = None,
    ) -> Path:
        """Checkpoint everything a resume needs into ``directory/step-NNNNNNNN`` (call on every
        rank); see :func:`rankwise.checkpoint.resume.save_state`.  Returns the checkpoint's path on
        every rank."""
        return resume.save_state(
            self,
            directory,
            model,
            optimizer,
            scheduler,
            extra,
            step=step,
            files=files,
            keep=keep,
            meta=meta,
        )

    def load_state(
        self,
        path: str | os.PathLike,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        scheduler=None,
        *,
        strict: bool = False,
    ) -> dict:
        """Restore what :meth:`save_state` wrote (call on every rank, after :meth:`prepare`);
        returns its ``extra`` with ``step`` added.  See
        :func:`rankwise.checkpoint.resume.load_state`."""
        return resume.load_state(self, path, model, optimizer, scheduler, strict=strict)

    def loaders(self) -> list[ResumableLoader]:
        """The loaders :meth:`loader` made that are still alive, in the order they were made."""
        return [loader for loader in (ref() for ref in self._loaders) if loader is not None]

    def resume_loaders(self, positions: list[dict]) -> None:
        """Continue this run's loaders, in the order they were made, where a checkpoint's stood
        (``positions``); a loader made later continues the next one left."""
        positions = list(positions)
        for loader in self.loaders():
            if not positions:
                break
            self._resume_loader(loader, positions.pop(0))
        self._positions = positions

    def _resume_loader(self, loader: ResumableLoader, recorded: dict) -> None:
        loader.resume(recorded, step_samples=loader.global_micro_batch * self._grad_accum)

    # -- teardown ----------------------------------------------------------------------------
    def teardown(self, clean: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        # Wrapped modules must be gone before the process group is destroyed: dropped here,
        # collected by process.destroy_process_group right before it leaves the group.
        self._prepared.clear()
        self.strategy.teardown(clean)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # an observer ends every rank at once
        done = exc_type is None or issubclass(exc_type, observers.Finished)
        if exc_type is None:
            for observer in self.observers:
                observer.ended(self)
        explained = hangs.explain(exc, self.env, self.strategy.timeout_s) if not done else None
        self.teardown(clean=done)
        if not done:
            # Under torchrun's agent (rankwise launch): the failure summary then names what
            # happened, not only an exit code, for a user's script too (rankwise train's worker
            # records it itself, with @record).
            record_for_launcher(explained or exc)
        if explained is not None:
            raise explained from exc


def setup(strategy: str | None = None, precision: str | None = None, **kwargs) -> Runtime:
    """Create the :class:`Runtime` for this process (joins the process group when launched with
    several).

    Without ``strategy`` / ``precision``: the launcher's choice (``rankwise launch --strategy``),
    else ``ddp`` when launched as one of several processes and ``single`` alone, at ``32-true``."""
    return Runtime(strategy, precision, **kwargs)
