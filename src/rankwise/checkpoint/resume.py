"""Training state on every rank: the checkpoint a resume needs, written and read the same way under
every strategy.

``Runtime.save_state`` / ``Runtime.load_state`` are these functions (``rt``: the calling Runtime). A
checkpoint holds the full weights (rank 0), the optimizer state as the strategy keeps it (whole,
FSDP shards, DeepSpeed partitions), the scheduler, the precision scaler, every rank's RNG, where
each ``rt.loader`` stands in its epoch (:mod:`rankwise.checkpoint.position`) and the caller's
``extra``; it is staged, checksummed and renamed into place only when every rank's share is written.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from rankwise import checkpoint as ckpt
from rankwise.checkpoint import loading
from rankwise.checkpoint.position import ResumableLoader
from rankwise.logs import get_logger
from rankwise.strategies import Strategy, format_owner, portable

log = get_logger(__name__)


class Host(Protocol):
    """What :func:`save_state` and :func:`load_state` use of the ``rankwise.Runtime`` that calls
    them (the runtime sits above this module, so it is described here, not imported)."""

    steps: int
    """Optimizer steps taken through ``rt.step``."""
    strategy: Strategy
    strategy_name: str

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def is_main(self) -> bool: ...

    def state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]: ...

    def all_gather_object(self, obj: Any) -> list: ...

    def broadcast_object(self, obj: Any, src: int = 0) -> Any: ...

    def barrier(self) -> None: ...

    def loaders(self) -> list[ResumableLoader]: ...

    def resume_loaders(self, positions: list[dict]) -> None: ...


def save_state(
    rt: Host,
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
    """Checkpoint everything a resume needs into ``directory/step-NNNNNNNN`` (call on every rank).

    Weights, optimizer state as the strategy keeps it (whole from rank 0, FSDP shards, DeepSpeed
    partitions), scheduler, precision scaler, every rank's RNG, ``extra`` (anything picklable,
    returned by :func:`load_state`) and ``files`` (name -> text, bytes or a path to copy).  Atomic:
    written into a staging directory, checksummed in a manifest written last, renamed into place;
    ``directory/latest`` then points at it and the newest ``keep`` are kept.  ``step`` defaults to
    the steps taken through ``rt.step``. ``meta``: small JSON facts recorded in the manifest beside
    world size, strategy and step, readable before launch without loading the checkpoint
    (``checkpoint.manifest_meta``). Returns the checkpoint's path on every rank.
    """
    root = Path(directory)
    step = rt.steps if step is None else step
    weights = rt.state_dict(model)  # a collective for sharded strategies
    rng = rt.all_gather_object(ckpt.rng_state())  # every rank's RNG differs (dropout masks)
    # Where each rt.loader stands in its epoch, the same on every rank (global positions): a
    # mid-epoch resume continues after the last batch the loop was handed.
    loaders = [
        {**loader.position(), "strategy": rt.strategy_name, "world_size": rt.world_size}
        for loader in rt.loaders()
    ]
    staging = ckpt.staging_dir(root, step)
    began = None
    if rt.is_main:
        _, began = ckpt.checked_write(rt.rank, staging, ckpt.begin_checkpoint, root, step)
    # Why: the staging directory must exist before any rank writes its share into it.
    rt.barrier()
    # Every rank calls the strategy's save even after a failure: sharded saves are collectives.
    _, error = ckpt.checked_write(
        rt.rank, staging, rt.strategy.save_state, staging, model, optimizer
    )
    error = began or error
    # Why: rank 0 checksums and renames the directory only once every rank's share is written;
    # a rank that could not write (disk full) makes every rank give up the checkpoint together.
    errors = [e for e in rt.all_gather_object(error) if e]
    final = None
    if rt.is_main and not errors:
        state = {
            "step": step,
            "extra": extra or {},
            "scheduler": scheduler.state_dict() if scheduler else None,
            "precision": rt.strategy.precision.state_dict(),
            "rng": rng,
            "world_size": rt.world_size,
            "strategy": rt.strategy_name,
            "loaders": loaders,
        }
        facts = {
            **(meta or {}),
            "world_size": rt.world_size,
            "strategy": rt.strategy_name,
            "step": step,
        }
        written, error = ckpt.checked_write(
            rt.rank,
            staging,
            ckpt.commit_checkpoint,
            root,
            step,
            weights=weights,
            training_state=state,
            files=files,
            keep=keep,
            meta=facts,
        )
        final, errors = (None, [error]) if error else (str(written), [])
    # Why: every rank returns only once the checkpoint is complete (and learns its path or the
    # error).
    final, errors = rt.broadcast_object((final, errors))
    if errors:
        if rt.is_main:  # every rank is done with the staging directory now
            shutil.rmtree(staging, ignore_errors=True)
        raise ckpt.CheckpointError(
            f"checkpoint of step {step} not written: {'; '.join(errors)}; the previous checkpoint "
            f"under {root} is intact"
        )
    return Path(final)


def load_state(
    rt: Host,
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler=None,
    *,
    strict: bool = False,
) -> dict:
    """Restore what :func:`save_state` wrote (call on every rank, after ``rt.prepare``); returns its
    ``extra`` with ``step`` added.  ``path``: a checkpoint, its folder or a run directory: the
    newest checkpoint whose files match their checksums is used, with a warning for each newer one
    that does not (``strict``: an error instead).

    A checkpoint of any strategy continues at any world size and under any other strategy: the
    strategy whose format it holds (``Strategy.claims``) reads it back whole by parameter name
    (``Strategy.read_whole_state``: FSDP's shards regrouped by ``torch.distributed.checkpoint``,
    DeepSpeed's partitions by its universal conversion), and this run's strategy loads that
    (``Strategy.load_state``, its own format directly).  Each rank continues old rank (rank mod N)'s
    random streams.
    """
    # Why: rank 0 chooses (verifying checksums once) and every rank loads the same checkpoint.
    found = error = None
    if rt.is_main:
        try:
            chosen, warnings_ = ckpt.find_loadable(path, strict=strict)
            found = str(chosen)
            for warning in warnings_:
                log.warning(f"warning: {warning}")
        except Exception as e:  # noqa: BLE001 - any failure here must reach every rank, not leave them waiting
            error = (
                str(e)
                if isinstance(e, ckpt.CheckpointError)
                else f"cannot read checkpoint {path}: {e}"
            )
    found, error = rt.broadcast_object((found, error))
    if error:
        raise ckpt.CheckpointError(error)
    directory = Path(found)
    state = loading.load(directory / ckpt.STATE, "training-state")
    written_by = state.get("strategy", rt.strategy_name)
    ckpt.check_compatible(
        directory,
        state,
        rt.strategy_name,
        rt.world_size,
        portable=portable(written_by, rt.strategy_name),
    )
    # Whichever strategy's format the checkpoint holds reads it; this run's strategy puts it in (its
    # own way).
    rt.strategy.load_state(directory, model, optimizer, writer=format_owner(directory, written_by))
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    rt.strategy.precision.load_state_dict(state["precision"])
    rngs = state["rng"]
    # At another world size the per-rank random streams cannot all continue: rank r takes old rank r
    # mod N's.
    ckpt.set_rng_state(rngs[rt.rank % len(rngs)])
    if len(rngs) != rt.world_size:
        log.info(
            f"note: {directory} was written by {len(rngs)} rank(s) ({written_by}), this run has "
            f"{rt.world_size} ({rt.strategy_name}): each rank continues old rank (rank mod "
            f"{len(rngs)})'s random streams, so dropout masks differ from an uninterrupted run; "
            "with dropout off the run continues within the stated tolerance",
            stderr=True,
        )
    rt.steps = state["step"]
    rt.resume_loaders(state.get("loaders", []))
    return {**state.get("extra", {}), "step": state["step"]}
