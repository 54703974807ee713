"""``rankwise train``'s pre-flight: everything about a run that can be refused before a worker
starts.

:func:`before_launch` runs before the data is read, :func:`resumable` once the run directory is
known, :func:`prepared_data` and :func:`continues_the_data` once the data is split; each failure is
one line naming the key.
"""

from __future__ import annotations

import os
from pathlib import Path

from rankwise.checkpoint import check_compatible, manifest_meta
from rankwise.data.prepare import PreparedData
from rankwise.errors import CheckpointError, ConfigError
from rankwise.launch.hosts import node_agent
from rankwise.launch.ports import port_in_use
from rankwise.models import check_model
from rankwise.precision import Precision
from rankwise.process import ProcessEnv, device_for, gpus_too_few
from rankwise.sampling.batching import check_enough_samples, micro_batch_size
from rankwise.strategies import check_world_size, lookup, portable, resolve_options
from rankwise.train import continuity
from rankwise.train.config import TrainConfig
from rankwise.train.rundir import RunDir


def before_launch(cfg: TrainConfig) -> None:
    """Everything about a run that can be refused before its data is read or a worker starts."""
    # a PyTorchJob pod, or one srun task per node
    if ProcessEnv.detect().distributed and not node_agent():
        raise ConfigError(
            "`rankwise train` starts its own workers (--nproc-per-node, --nnodes); run it "
            "directly, not under torchrun / rankwise launch, and under srun as one task per node "
            "(--ntasks-per-node=1)"
        )
    variant = lookup(cfg.strategy)
    try:
        variant.cls.check_available()
    except ImportError as e:
        raise ConfigError(str(e)) from None
    resolve_options(variant, cfg.strategy_options())
    if cfg.compile:
        variant.cls.check_compile()
    launcher = variant.cls.launcher or cfg.launch.launcher
    if len(cfg.world_sizes) > 1 and launcher != "torchrun":
        raise ConfigError(
            f"launch.nnodes={cfg.launch.nnodes}: an elastic node range needs the torchrun launcher "
            f"({cfg.strategy} starts its workers with {launcher})"
        )
    sharing = gpus_too_few(cfg.launch.nproc_per_node) if variant.cls.multiprocess else None
    if sharing:
        raise ConfigError(f"launch.nproc_per_node: {sharing}")
    # an elastic job must work at whichever size the rendezvous settles on
    for world_size in cfg.world_sizes:
        check_world_size(variant, world_size)
        micro_batch_size(cfg.batch_size, world_size, cfg.grad_accum)
    try:
        Precision(cfg.precision, device_for(0))
        check_model(
            cfg.model.name, reads_text=cfg.data.source != "toy", max_length=cfg.data.max_length
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_master_port(cfg)


def check_master_port(cfg: TrainConfig) -> None:
    """The node hosting the rendezvous must be able to listen on the port it was given."""
    launch = cfg.launch
    if launch.rdzv_backend or launch.node_rank != 0 or launch.master_port is None:
        return  # a free port is chosen on one node; other nodes only connect
    if port_in_use(launch.master_port):
        raise ConfigError(
            f"launch.master_port: {launch.master_addr}:{launch.master_port} is already in use on "
            "this node; choose another --master-port (or leave it unset on a single node)"
        )


def _latest(cfg: TrainConfig) -> Path:
    """``--resume latest``: the run directory's latest checkpoint."""
    assert cfg.out is not None  # train() set it (default_run_dir) before these checks
    return RunDir(Path(cfg.out)).latest


def resumable(cfg: TrainConfig) -> None:
    """``--resume``: a checkpoint exists that this run can continue (any known strategy's, at any
    world size: ``strategies.portable``)."""
    if cfg.resume is None:
        return
    path = _latest(cfg) if cfg.resume == "latest" else cfg.resume
    try:
        meta = manifest_meta(path)
    except (CheckpointError, OSError) as e:
        if cfg.strict or not os.path.lexists(path):
            raise ConfigError(f"--resume {cfg.resume}: {e}") from None
        # a damaged latest: the workers fall back to an earlier checkpoint and check that one
        return
    # checkpoints written before the manifest recorded these facts are checked by the workers
    if meta:
        check_compatible(
            path,
            meta,
            cfg.strategy,
            cfg.world_size,
            portable=portable(meta.get("strategy", cfg.strategy), cfg.strategy),
        )


def continues_the_data(cfg: TrainConfig, data: PreparedData) -> None:
    """``--resume``: the checkpoint was trained on this data in this sample order (checked before
    the prepared data replaces the run directory's: a changed data file is refused, and the run's
    own data kept)."""
    if cfg.resume is None:
        return
    path = _latest(cfg) if cfg.resume == "latest" else cfg.resume
    try:
        recorded = manifest_meta(path).get("continuity")
    except (CheckpointError, OSError):
        # unreadable: ``resumable`` let the workers fall back to an earlier checkpoint, which they
        # check
        return
    if not recorded:
        return  # written before checkpoints recorded it
    lengths = getattr(data.dataset("train"), "lengths", None) if cfg.data.group_by_length else None
    sampler = continuity.training_sampler(data.size("train"), cfg.batch_size, cfg.seed, lengths)
    continuity.check_before_launch(
        path, recorded, data.digest("train"), sampler, cfg.batch_size, cfg.data.source
    )


def prepared_data(cfg: TrainConfig, sizes: dict[str, int]) -> None:
    """Checks that need the data's split sizes (read in the launching process, before workers
    start)."""
    check_enough_samples(sizes["train"], cfg.batch_size, "the training split")
    if not sizes[cfg.eval_split]:
        raise ConfigError(
            f"eval_split={cfg.eval_split!r}: the {cfg.eval_split} split of {cfg.data.source} is "
            "empty; add rows, raise data.test_percent / data.dev_percent, or evaluate the other "
            "split"
        )
