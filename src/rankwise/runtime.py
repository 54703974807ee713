"""The public API for your own training loop.

A single-device script becomes distributed by changing a few lines::

    import rankwise

    with rankwise.setup(strategy="ddp", precision="32-true", seed=0) as rt:
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
                    norm = rt.step(optimizer, model, max_norm=1.0)   # clip + step; the global norm before clipping
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
import gc
import os
import random
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from rankwise import checkpoint as ckpt
from rankwise import dist, hangs
from rankwise.batching import LengthGroupedSampler, check_enough_samples, micro_batch_size
from rankwise.launch.choice import settle
from rankwise.probe import Probe, ProbeDone
from rankwise.process import ProcessEnv
from rankwise.strategies import LoopFacts, Strategy, check_world_size, lookup, resolve_options
from rankwise.strategies.options import Options


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Runtime:
    """One process's view of a distributed run: its strategy, device, rank and collectives."""

    def __init__(self, strategy: str | None = None, precision: str | None = None, *, seed: int | None = 0,
                 options: Options | Mapping[str, Any] | None = None, timeout_s: float = 300.0,
                 env: ProcessEnv | None = None):
        """``strategy`` / ``precision``: when not given, what ``rankwise launch --strategy / --precision``
        chose, else ``ddp`` for one of several processes (``single`` alone) and ``32-true``.
        ``options``: the strategy's own section (e.g. ``{"zero_stage": 3}`` for deepspeed), merged with
        the launcher's ``--set``; a variant's fixed settings (``deepspeed-zero3``) apply on top and
        must not be contradicted."""
        self.env = env or ProcessEnv.detect()
        strategy, precision, options = settle(strategy, precision, options, self.env.world_size)
        variant = lookup(strategy)
        strategy_cls = variant.cls
        strategy_cls.check_available()
        check_world_size(variant, self.env.world_size)
        self.strategy: Strategy = strategy_cls(self.env, precision, resolve_options(variant, options), timeout_s)
        self.strategy_name = strategy
        self.strategy.setup_environment()
        seen = self.strategy.library_world_size if self.strategy.multiprocess and self.env.distributed else None
        if seen is not None and seen != self.env.world_size:
            self.strategy.teardown(clean=False)  # the group was joined: leave it before refusing
            raise RuntimeError(
                f"rank {self.rank}: the {strategy} library sees world size {seen}, "
                f"the launcher started {self.env.world_size} processes: each process would train alone"
            )
        hangs.announce(self.env)  # which node and address each rank runs on, should it later go silent
        self.seed = seed
        if seed is not None:
            seed_everything(seed)
        self.probe = Probe.from_environment()
        """Measurements a benchmark asked for (``rankwise bench --script``); ``None`` otherwise."""
        self.steps = 0
        """Optimizer steps taken through :meth:`step` (restored by :meth:`load_state`)."""
        self._prepared: list[nn.Module] = []
        self._stepped_by_clip: torch.optim.Optimizer | None = None
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
    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *, grad_accum: int = 1,
                micro_batch_size: int | None = None):
        """Move and wrap the model for the strategy; returns ``(model, optimizer)``.

        Build the optimizer on the *unwrapped* model's parameters before calling this
        (the same code as a single-device script).  ``grad_accum``: micro-batches per
        optimizer step, when the loop accumulates (Horovod and DeepSpeed must know it up
        front); ``micro_batch_size``: samples per rank per micro-batch, if known.
        """
        if grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {grad_accum}")
        facts = LoopFacts(grad_accum=grad_accum, micro_batch_size=micro_batch_size)
        if self.probe:
            self.probe.prepared(model, grad_accum)
        wrapped, optimizer = self.strategy.setup(model, optimizer, facts)
        self._prepared.append(wrapped)
        return wrapped, optimizer

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
        micro_batch_size(batch_size, self.world_size)
        drop_last = shuffle if drop_last is None else drop_last
        if self.probe and shuffle:
            self.probe.loader(batch_size)
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
        if drop_last:
            check_enough_samples(len(dataset), batch_size)
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

    # -- evaluation --------------------------------------------------------------------------
    def eval_loader(self, dataset: Dataset, per_rank_batch: int, collate_fn=None) -> Iterable:
        """This rank's share of an evaluation set, as the strategy shards it; feed each batch's
        per-sample outputs to an :meth:`eval_gatherer`."""
        return self.strategy.eval_loader(dataset, per_rank_batch, collate_fn)

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
        self.strategy.backward(loss, model)

    def step(self, optimizer: torch.optim.Optimizer, model: nn.Module,
             max_norm: float | None = None) -> torch.Tensor | None:
        """Take one optimizer step on the gradients of every rank, first clipping their global norm to
        ``max_norm`` when given; returns that norm before clipping (the same on every rank and under
        every strategy), or ``None`` without clipping.  Clip and step are one call because some
        strategies (DeepSpeed ZeRO) can only clip inside their step."""
        if self._stepped_by_clip is optimizer:  # clip_grad_norm already took this step
            self._stepped_by_clip = None
            if max_norm is not None:
                raise RuntimeError("rt.clip_grad_norm already clipped and took this step; call rt.step without "
                                   "max_norm after it, or only rt.step(optimizer, model, max_norm=...)")
            norm = None
        else:
            norm = self.strategy.step(optimizer, model, max_norm)
        self.steps += 1
        if self.probe:
            self.probe.stepped(self, model)
        return norm

    def clip_grad_norm(self, model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
        """The older spelling of ``rt.step(optimizer, model, max_norm)``: clips to ``max_norm`` and takes the
        optimizer step right away, returning the global norm before clipping; the :meth:`step` that
        follows in the loop then only counts the step."""
        norm = self.strategy.step(optimizer, model, max_norm)
        self._stepped_by_clip = optimizer
        return norm

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
        state = self.state_dict(model)
        if self.is_main:
            ckpt.write_weights(state, path)
        # Why: other ranks must not read the file, or exit, before rank 0 finished writing it.
        self.barrier()

    def load_weights(self, model: nn.Module, path: str | os.PathLike) -> None:
        self.strategy.load_model_state_dict(model, ckpt.read_weights(path))

    # -- training state ----------------------------------------------------------------------
    def save_state(self, directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                   scheduler=None, extra: dict | None = None, *, step: int | None = None,
                   files: Mapping[str, str | os.PathLike | bytes] | None = None, keep: int = 2) -> Path:
        """Checkpoint everything a resume needs into ``directory/step-NNNNNNNN`` (call on every rank).

        Weights, optimizer state as the strategy keeps it (whole from rank 0, FSDP shards,
        DeepSpeed partitions), scheduler, precision scaler, every rank's RNG, ``extra``
        (anything picklable, returned by :meth:`load_state`) and ``files`` (name -> text,
        bytes or a path to copy).  Atomic: written into a staging directory, checksummed in a
        manifest written last, renamed into place; ``directory/latest`` then points at it and
        the newest ``keep`` are kept.  ``step`` defaults to the steps taken through :meth:`step`.
        Returns the checkpoint's path on every rank.
        """
        root = Path(directory)
        step = self.steps if step is None else step
        weights = self.state_dict(model)  # a collective for sharded strategies
        rng = self.all_gather_object(ckpt.rng_state())  # every rank's RNG differs (dropout masks)
        staging = ckpt.staging_dir(root, step)
        began = None
        if self.is_main:
            _, began = ckpt.checked_write(self.rank, staging, ckpt.begin_checkpoint, root, step)
        # Why: the staging directory must exist before any rank writes its share into it.
        self.barrier()
        # Every rank calls the strategy's save even after a failure: sharded saves are collectives.
        _, error = ckpt.checked_write(self.rank, staging, self.strategy.save_state, staging, model, optimizer)
        error = began or error
        # Why: rank 0 checksums and renames the directory only once every rank's share is written;
        # a rank that could not write (disk full) makes every rank give up the checkpoint together.
        errors = [e for e in self.all_gather_object(error) if e]
        final = None
        if self.is_main and not errors:
            state = {"step": step, "extra": extra or {}, "scheduler": scheduler.state_dict() if scheduler else None,
                     "precision": self.strategy.precision.state_dict(), "rng": rng, "world_size": self.world_size,
                     "strategy": self.strategy_name}
            meta = {"world_size": self.world_size, "strategy": self.strategy_name}
            written, error = ckpt.checked_write(self.rank, staging, ckpt.commit_checkpoint, root, step, weights=weights,
                                                 training_state=state, files=files, keep=keep, meta=meta)
            final, errors = (None, [error]) if error else (str(written), [])
        # Why: every rank returns only once the checkpoint is complete (and learns its path or the error).
        final, errors = self.broadcast_object((final, errors))
        if errors:
            if self.is_main:  # every rank is done with the staging directory now
                shutil.rmtree(staging, ignore_errors=True)
            raise ckpt.CheckpointError(f"checkpoint of step {step} not written: {'; '.join(errors)}; the previous "
                                       f"checkpoint under {root} is intact")
        return Path(final)

    def load_state(self, path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                   scheduler=None, *, strict: bool = False) -> dict:
        """Restore what :meth:`save_state` wrote (call on every rank, after :meth:`prepare`); returns its
        ``extra`` with ``step`` added.  ``path``: a checkpoint, its folder or a run directory: the newest
        checkpoint whose files match their checksums is used, with a warning for each newer one that
        does not (``strict``: an error instead).

        The checkpoint must come from the same strategy and world size: sharded state is split
        per rank.  To continue elsewhere, start from its weights (``rankwise export``).
        """
        # Why: rank 0 chooses (verifying checksums once) and every rank loads the same checkpoint.
        found = error = None
        if self.is_main:
            try:
                chosen, warnings_ = ckpt.find_loadable(path, strict=strict)
                found = str(chosen)
                for warning in warnings_:
                    print(f"warning: {warning}", file=sys.stderr, flush=True)
            except Exception as e:  # noqa: BLE001 - any failure here must reach every rank, not leave them waiting
                error = str(e) if isinstance(e, ckpt.CheckpointError) else f"cannot read checkpoint {path}: {e}"
        found, error = self.broadcast_object((found, error))
        if error:
            raise ckpt.CheckpointError(error)
        directory = Path(found)
        state = torch.load(directory / ckpt.STATE, map_location="cpu", weights_only=False)
        ckpt.check_compatible(directory, state, self.strategy_name, self.world_size)
        self.strategy.load_state(directory, model, optimizer)
        if scheduler is not None and state["scheduler"] is not None:
            scheduler.load_state_dict(state["scheduler"])
        self.strategy.precision.load_state_dict(state["precision"])
        ckpt.set_rng_state(state["rng"][self.rank])
        self.steps = state["step"]
        return {**state.get("extra", {}), "step": state["step"]}

    # -- teardown ----------------------------------------------------------------------------
    def teardown(self, clean: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        # Wrapped modules must be gone before the process group is destroyed (see env.destroy_process_group).
        self._prepared.clear()
        gc.collect()
        self.strategy.teardown(clean)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        done = exc_type is None or issubclass(exc_type, ProbeDone)  # the probe ends every rank at one step
        explained = hangs.explain(exc, self.env, self.strategy.timeout_s) if not done else None
        self.teardown(clean=done)
        if explained is not None:
            raise explained from exc


def setup(strategy: str | None = None, precision: str | None = None, **kwargs) -> Runtime:
    """Create the :class:`Runtime` for this process (joins the process group when launched with several).

    Without ``strategy`` / ``precision``: the launcher's choice (``rankwise launch --strategy``), else
    ``ddp`` when launched as one of several processes and ``single`` alone, at ``32-true``."""
    return Runtime(strategy, precision, **kwargs)
