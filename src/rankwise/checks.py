"""Checks that refuse a run, each written once and used wherever it applies.

``rankwise train`` calls :func:`before_launch` and :func:`prepared_data` in the launching
process, so bad settings fail before any worker starts, with one line naming the key;
:class:`~rankwise.runtime.Runtime` calls the same functions inside a user's own script.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rankwise.errors import ConfigError

if TYPE_CHECKING:
    from rankwise.config import TrainConfig
    from rankwise.strategies import Strategy, Variant
    from rankwise.strategies.options import Options


def micro_batch_size(batch_size: int, world_size: int, grad_accum: int = 1) -> int:
    """Per-rank micro-batch of a global batch; refuses a batch that does not split evenly."""
    per_step = world_size * grad_accum
    if batch_size % per_step:
        raise ConfigError(
            f"batch_size={batch_size} is not divisible by world_size ({world_size}) x grad_accum ({grad_accum}) "
            f"= {per_step}; the global batch must split evenly across ranks and micro-batches")
    return batch_size // per_step


def check_enough_samples(samples: int, batch_size: int, what: str = "the training data") -> None:
    if samples < batch_size:
        raise ConfigError(f"{what} has {samples} samples, fewer than one global batch ({batch_size}); "
                          "lower --batch-size")


def check_world_size(name: str, cls: type[Strategy], world_size: int) -> None:
    if not cls.multiprocess and world_size > 1:
        raise ConfigError(f"strategy {name!r} runs in one process, but the job has {world_size} processes; "
                          "drop --nproc-per-node / --nnodes (or the launcher), or use a multi-process strategy "
                          "such as ddp")


def strategy_options(variant: Variant, options: Options | Mapping[str, Any] | None) -> Options | None:
    """The strategy's options: the given ones with the variant's fixed settings applied, validated."""
    cls = variant.cls
    fixed = variant.options_for(cls.options_section)
    if cls.options_cls is None:
        if options:
            raise ConfigError(f"strategy {variant.name!r} takes no options (got {dict(options)})")
        return None
    if options is None:
        given: dict[str, Any] = {}
    elif isinstance(options, cls.options_cls):
        given = {key: getattr(options, key) for key in options.model_fields_set}
    else:
        given = dict(options)
    clashes = {key: given[key] for key in fixed if key in given and given[key] != fixed[key]}
    if clashes:
        key, value = next(iter(clashes.items()))
        raise ConfigError(f"strategy {variant.name!r} sets {cls.options_section}.{key}={fixed[key]!r}; "
                          f"it was also given {value!r}")
    # An options object keeps its defaults too; a mapping holds only what was given.
    base = options.model_dump() if isinstance(options, cls.options_cls) else given
    merged = cls.options_cls.model_validate({**base, **fixed})
    cls.check_options(merged)
    return merged


def check_resumable(directory: os.PathLike, state: dict, strategy: str, world_size: int) -> None:
    if state["world_size"] != world_size:
        raise ConfigError(f"checkpoint {directory} was written at world size {state['world_size']}, this run has "
                          f"{world_size}; resume with the same number of processes, or start a new run from its "
                          "weights (rankwise export, model.init_weights)")
    if state.get("strategy", strategy) != strategy:
        raise ConfigError(f"checkpoint {directory} was written by strategy {state['strategy']!r}; resume with it, "
                          "or start a new run from its weights (rankwise export, model.init_weights)")


def before_launch(cfg: TrainConfig) -> None:
    """Everything about a run that can be refused before its data is read or a worker starts."""
    from rankwise.env import ProcessEnv, device_for
    from rankwise.models import check_model
    from rankwise.precision import Precision
    from rankwise.strategies import lookup

    if ProcessEnv.detect().distributed and "PET_NNODES" not in os.environ:  # a PyTorchJob pod is a node, not a rank
        raise ConfigError("`rankwise train` starts its own workers (--nproc-per-node, --nnodes); run it directly, "
                          "not under torchrun / rankwise launch / srun")
    variant = lookup(cfg.strategy)
    try:
        variant.cls.check_available()
    except ImportError as e:
        raise ConfigError(str(e)) from None
    strategy_options(variant, cfg.strategy_options())
    launcher = variant.cls.launcher or cfg.launch.launcher
    if len(cfg.world_sizes) > 1 and launcher != "torchrun":
        raise ConfigError(f"launch.nnodes={cfg.launch.nnodes}: an elastic node range needs the torchrun launcher "
                          f"({cfg.strategy} starts its workers with {launcher})")
    for world_size in cfg.world_sizes:  # an elastic job must work at whichever size the rendezvous settles on
        check_world_size(cfg.strategy, variant.cls, world_size)
        micro_batch_size(cfg.batch_size, world_size, cfg.grad_accum)
    try:
        Precision(cfg.precision, device_for(0))
        check_model(cfg.model.name, reads_text=cfg.data.source != "toy", max_length=cfg.data.max_length)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_master_port(cfg)


def check_master_port(cfg: TrainConfig) -> None:
    """The node hosting the rendezvous must be able to listen on the port it was given."""
    from rankwise.launch.ports import port_in_use

    launch = cfg.launch
    if launch.rdzv_backend or launch.node_rank != 0 or launch.master_port is None:
        return  # a free port is chosen on one node; other nodes only connect
    if port_in_use(launch.master_port):
        raise ConfigError(f"launch.master_port: {launch.master_addr}:{launch.master_port} is already in use on this "
                          "node; choose another --master-port (or leave it unset on a single node)")


def resumable(cfg: TrainConfig) -> None:
    """``--resume``: a checkpoint exists and was written by this strategy at this world size."""
    from rankwise.checkpoint import CheckpointError, manifest_meta
    from rankwise.rundir import RunDir

    if cfg.resume is None:
        return
    path = RunDir(cfg.out).latest if cfg.resume == "latest" else cfg.resume
    try:
        meta = manifest_meta(path)
    except (CheckpointError, OSError) as e:
        if cfg.strict or not os.path.lexists(path):
            raise ConfigError(f"--resume {cfg.resume}: {e}") from None
        return  # a damaged latest: the workers fall back to an earlier checkpoint and check that one
    if meta:  # checkpoints written before the manifest recorded these facts are checked by the workers
        check_resumable(path, meta, cfg.strategy, cfg.world_size)


def prepared_data(cfg: TrainConfig, sizes: dict[str, int]) -> None:
    """Checks that need the data's split sizes (read in the launching process, before workers start)."""
    check_enough_samples(sizes["train"], cfg.batch_size, "the training split")
    if not sizes[cfg.eval_split]:
        raise ConfigError(f"eval_split={cfg.eval_split!r}: the {cfg.eval_split} split of {cfg.data.source} is empty; "
                          "add rows, raise data.test_percent / data.dev_percent, or evaluate the other split")
