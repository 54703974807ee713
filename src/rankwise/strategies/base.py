"""The contract every strategy implements: :class:`Strategy`, an abstract base class.

A strategy decides how a model and optimizer are wrapped, how the backward pass and
the optimizer step run, how gradient synchronisation is skipped during accumulation,
how evaluation is sharded and gathered, and how training state is saved and loaded.
It gets its own options section and the loop facts it needs (``LoopFacts``), never the
run configuration.  It never starts processes (that is :mod:`rankwise.launch`) and never
contains a training loop (a user's, or the built-in task's :mod:`rankwise.train.loop`).

What a strategy must decide for itself is abstract (``wrap``, ``unwrap``, ``no_sync``,
``library_world_size``); what most strategies share has a default here, which a strategy overrides
where it differs.  Every override carries ``@override``, and ``tests/strategies/test_contract.py``
checks each registered strategy against this.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from rankwise import dist, process
from rankwise.checkpoint import WEIGHTS, CheckpointError, loading, read_weights
from rankwise.checkpoint.atomic_files import cpu_copies
from rankwise.checkpoint.convert import by_index, by_name, parameter_names
from rankwise.compat.torch_compile import compile_forward
from rankwise.errors import ConfigError
from rankwise.precision import Precision
from rankwise.process import ProcessEnv
from rankwise.sampling.batching import OrderedShardSampler
from rankwise.strategies.blocks import checkpoint_blocks
from rankwise.strategies.facts import Facts
from rankwise.strategies.options import Options

OPTIMIZER_FILE = "optimizer.pt"
"""Full optimizer state in a checkpoint of a strategy that keeps it whole on every rank (the base's
format)."""


@dataclass(frozen=True)
class LoopFacts:
    """What the training loop tells a strategy when it prepares the model (``Runtime.prepare``)."""

    grad_accum: int = 1
    """Micro-batches per optimizer step: Horovod's ``backward_passes_per_step``, DeepSpeed's
    accumulation."""
    micro_batch_size: int | None = None
    """Samples per rank per micro-batch, when the loop knows it (DeepSpeed's bookkeeping; 1
    otherwise)."""
    compile: bool = False
    """Compile the model with ``torch.compile`` (inductor), at the point the strategy's wrapping
    allows."""
    activation_checkpointing: bool = False
    """Recompute each transformer layer's activations in the backward pass
    (:mod:`rankwise.strategies.blocks`)."""


class Strategy(abc.ABC):
    """How one process wraps, steps, evaluates and checkpoints under one data-parallel library.

    The loop (a user's through :class:`rankwise.Runtime`, or :mod:`rankwise.train.loop`) calls, in
    order: ``setup_environment`` once, ``setup`` once, then per step ``no_sync`` around all but the
    last micro-batch, ``backward`` per micro-batch, ``step`` and ``zero_grad``; ``eval_loader`` /
    ``eval_gatherer`` to evaluate; ``save_state`` / ``load_state`` to checkpoint; ``teardown`` once
    at the end, also after an error.
    """

    name: ClassVar[str]
    """Name used with ``--strategy``."""
    multiprocess: ClassVar[bool] = True
    """Whether the strategy runs one process per device (and so needs a launcher)."""
    description: ClassVar[str] = ""
    """One line for ``--help``."""
    launcher: ClassVar[str | None] = None
    """A launcher the strategy needs (e.g. horovodrun), overriding launch.launcher."""
    requires: ClassVar[tuple[str, ...]] = ()
    """Importable modules the strategy needs beyond torch."""
    install: ClassVar[str] = ""
    """The command that installs them."""
    cannot_compile: ClassVar[str | None] = None
    """Why ``torch.compile`` is refused under this strategy; ``None`` where it compiles."""
    options_section: ClassVar[str | None] = None
    """The config section holding this strategy's options (``ddp``, ``deepspeed``, ...)."""
    options_cls: ClassVar[type[Options] | None] = None
    """The options' type; ``None`` for strategies without options."""
    whole_state: ClassVar[bool] = True
    """Whether its checkpoints hold the whole optimizer state in one file (rank 0's): such a
    checkpoint loads at any world size and under any other whole-state strategy.  ``False`` where
    each rank saves its own shard."""
    reshards: ClassVar[bool] = False
    """Whether its per-rank shards load at another world size (the library regroups them on
    load)."""
    strategy_facts: ClassVar[Facts | None] = None
    """What it shards, the collectives a step makes, its memory layout and its bench rows
    (:mod:`rankwise.strategies.facts`), read by ``rankwise plan`` and ``rankwise bench``; ``None``:
    neither has a model of it (a variant may declare its own)."""

    @property
    def gathers_layers(self) -> bool:
        """Whether every step gathers whole layers' parameters and frees them again (FSDP, ZeRO-3):
        on a CPU such a rank fixes glibc's mmap threshold
        (:func:`rankwise.process.fix_mmap_threshold`) so the freed blocks leave its resident memory;
        any other rank would only pay for it."""
        return False

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
                raise ImportError(
                    f"strategy {cls.name!r} needs the {module.split('.')[0]} library: {cls.install}"
                )

    @classmethod
    def check_options(cls, options: Options | None) -> None:
        """Raise ConfigError for options this strategy cannot run (called before any worker
        starts)."""
        return None  # every value its options' type validates

    @classmethod
    def check_compile(cls) -> None:
        """Raise ConfigError where this strategy cannot compile the model (before any worker
        starts)."""
        if cls.cannot_compile:
            raise ConfigError(
                f"strategy {cls.name!r} cannot use torch.compile: {cls.cannot_compile}"
            )

    def __init__(
        self,
        env: ProcessEnv,
        precision: str = "32-true",
        options: Options | None = None,
        timeout_s: float = 300.0,
    ):
        self.env = env
        if options is None and self.options_cls is not None:
            options = self.options_cls()
        self.options = options
        """This strategy's own options section (``None`` when it has none)."""
        self.timeout_s = timeout_s
        self.device = process.device_for(env.local_rank)
        self.precision = self.make_precision(precision)
        self.facts = LoopFacts()

    def make_precision(self, name: str) -> Precision:
        """The precision object this strategy really uses (its scaler is what checkpoints save)."""
        return Precision(name, self.device)

    # -- lifecycle ---------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Join the process group (multi-process strategies); fix the allocator's mmap threshold
        where the strategy gathers and frees layers on a CPU (:attr:`gathers_layers`)."""
        if self.gathers_layers and self.device.type == "cpu":
            process.fix_mmap_threshold()
        process.init_process_group(self.env, self.device, self.timeout_s)

    def teardown(self, clean: bool = True) -> None:
        """Leave the process group and release the library's process-wide state (called once, also
        after an error; ``clean``: whether the other ranks are expected to leave too, so a barrier
        is safe)."""
        process.destroy_process_group(clean)

    # -- wrapping ----------------------------------------------------------------------------
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, facts: LoopFacts):
        """Keep the loop's facts, then wrap model and optimizer together (``wrap``): layers
        checkpointed before any wrapping (inside FSDP's and ZeRO-3's units), the model compiled
        after it (``compile``)."""
        self.facts = facts
        if facts.compile:
            self.check_compile()
        if facts.activation_checkpointing:
            checkpoint_blocks(model)
        model, optimizer = self.wrap(model, optimizer)
        if facts.compile:
            model = self.compile(model)
        return model, optimizer

    def compile(self, model: nn.Module) -> nn.Module:
        """``torch.compile`` the model inside the strategy's wrapper, in place (parameter names, and
        so checkpoints, do not change).  The wrapper itself stays eager: DDP's forward breaks
        Dynamo's graph at once (its logger), and the module it calls then ran eagerly.  Compiled
        inside DDP's forward, the module's graph is split at the gradient buckets' boundaries
        (Dynamo's DDPOptimizer), so the all-reduces still overlap the backward pass."""
        compile_forward(self.unwrap(model))
        return model

    @abc.abstractmethod
    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer | None):
        """``(model, optimizer)`` ready to train under this strategy: moved to this rank's device
        and wrapped together (FSDP and DeepSpeed need both at once).  The loop uses only what this
        returns from then on; the optimizer returned steps the returned model's parameters
        (``optimizer`` may be ``None``)."""

    def place(self, model: nn.Module) -> nn.Module:
        """``model`` on this rank's device, unless its builder already spread it over several
        (model.split_devices)."""
        if len({p.device for p in model.parameters()}) > 1:
            return model
        return model.to(self.device)

    @abc.abstractmethod
    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside what :meth:`wrap` returned: its parameter names (no ``module.``
        prefix) are the names checkpoints, gradients and weights are keyed by."""

    # -- the step ----------------------------------------------------------------------------
    @abc.abstractmethod
    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Context around every micro-batch but a step's last, in which backward passes accumulate
        gradients locally without synchronising them across ranks (the loop relies on the step's
        last backward, outside it, to make every rank's gradients the same)."""

    def backward(self, loss: torch.Tensor, model: nn.Module) -> None:
        """Backward pass of one micro-batch's loss (already divided by the accumulation count),
        through the precision's scaler."""
        self.precision.backward(loss)

    def step(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, max_norm: float | None = None
    ) -> torch.Tensor | None:
        """One optimizer step on the gradients of every rank, clipped first to ``max_norm`` when
        given.

        Returns the global gradient norm before clipping (all ranks' gradients together, the
        same on every rank), or ``None`` without clipping.
        """
        norm = None
        if max_norm is not None:
            self.precision.unscale(optimizer)
            norm = full_tensor(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
        self.precision.step(optimizer)
        return norm

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Drop the gradients after a step, so the next step's first backward starts from none."""
        optimizer.zero_grad(set_to_none=True)

    @property
    def shards_optimizer_state(self) -> bool:
        """Whether each rank steps only its share of the optimizer state (FSDP, ZeRO stage 1 and
        up)."""
        return False

    def gradient_scale(self) -> float:
        """What the gradients are multiplied by until the step unscales them (a 16-bit loss scale;
        else 1)."""
        return self.precision.loss_scale()

    def full_gradients(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Every parameter's gradient as the optimizer is about to apply it (after the ranks
        exchanged them, before clipping and unscaled), whole, in fp32 on the CPU, by unwrapped name,
        on rank 0 (other ranks get ``{}``); parameters without one are left out.  Called between the
        last backward of a step and the step, on every rank: where gradients are sharded (FSDP2's
        DTensors) gathering each is a collective."""
        gradients, scale = {}, self.gradient_scale()
        for name, param in self.unwrap(model).named_parameters():
            if param.grad is not None:
                # every rank takes part; rank 0 keeps the copy
                whole = full_tensor(param.grad.detach())
                if self.env.is_main:
                    gradients[name] = whole.float().cpu() / scale
        return gradients

    # -- evaluation --------------------------------------------------------------------------
    def eval_loader(
        self, dataset, per_rank_batch: int, collate_fn=None, order: list[int] | None = None
    ) -> DataLoader:
        """This rank's shard of an evaluation set: every sample once, the last shard padded by
        repeats; in ``order`` when given (else index order)."""
        sampler: Sampler
        if order is not None:
            sampler = OrderedShardSampler(order, self.env.world_size, self.env.rank)
        else:
            sampler = DistributedSampler(
                dataset,
                num_replicas=self.env.world_size,
                rank=self.env.rank,
                shuffle=False,
                drop_last=False,
            )
        return DataLoader(
            dataset,
            batch_size=per_rank_batch,
            sampler=sampler,
            collate_fn=collate_fn,
            pin_memory=self.device.type == "cuda",
        )

    def eval_gatherer(self, total: int) -> dist.ExactGather:
        """Collects per-sample outputs of :meth:`eval_loader`'s batches; its ``result()`` has each
        sample once."""
        return dist.ExactGather(total)

    # -- state -------------------------------------------------------------------------------
    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Full, unwrapped weights (no ``module.`` prefix), on the CPU."""
        return cpu_copies(self.unwrap(model).state_dict())  # tied parameters stay one tensor

    def load_model_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load full weights by unwrapped name into the (wrapped) model, on every rank."""
        self.unwrap(model).load_state_dict(state)

    # -- checkpoint format: each strategy recognises, writes and reads back its own --------------
    # Here the format of strategies whose optimizer state is whole on every rank: rank 0's optimizer
    # file.
    @classmethod
    def claims(cls, directory: Path) -> bool:
        """Whether checkpoint ``directory`` holds optimizer state in this strategy's format (as its
        :meth:`save_state` writes it).  Resuming asks every registered strategy (the writer first)
        and reads the checkpoint through the one that claims it
        (:func:`rankwise.strategies.format_owner`)."""
        return (directory / OPTIMIZER_FILE).is_file()

    def save_state(self, directory: Path, model: nn.Module, optimizer) -> None:
        """Write what this strategy needs beyond the full weights (written by the checkpoint
        protocol) into ``directory``; every rank calls it, so a sharded strategy's ranks each write
        their share."""
        if optimizer is not None and self.env.is_main:
            torch.save(optimizer.state_dict(), directory / OPTIMIZER_FILE)

    @classmethod
    def read_whole_state(
        cls, directory: Path, module: nn.Module, names: list[list[str]] | None
    ) -> tuple[dict[str, torch.Tensor], dict | None]:
        """A checkpoint in this strategy's format read back whole in this process, whatever world
        size wrote it: full weights by name and optimizer state keyed by parameter name
        (``by_name``), the form every strategy's :meth:`load_whole_state` takes.  ``module``: the
        loading run's unwrapped model; ``names``: its parameters' names by optimizer group
        (``None``: the loading run has no optimizer, so only the weights are read)."""
        weights = read_weights(directory / WEIGHTS)
        if names is None:
            return weights, None
        if not cls.claims(directory):
            raise CheckpointError(
                f"{directory} holds no optimizer state ({OPTIMIZER_FILE}): it was saved without an "
                "optimizer; load its weights instead (model.init_weights)"
            )
        return weights, by_name(loading.load(directory / OPTIMIZER_FILE, "optimizer-state"), names)

    def load_state(
        self, directory: Path, model: nn.Module, optimizer, writer: type[Strategy] | None = None
    ) -> None:
        """Restore model and optimizer from checkpoint ``directory`` (every rank calls it),
        whichever strategy wrote it at whatever world size: ``writer`` (the strategy that claims it;
        default this one) reads it whole (:meth:`read_whole_state`) and :meth:`load_whole_state`
        puts it in.  A strategy that loads its own format faster (per-rank shards at the same world
        size) overrides this and falls back here for any other."""
        module = self.unwrap(model)
        names = self.optimizer_names(module, optimizer)
        weights, optim = (writer or type(self)).read_whole_state(directory, module, names)
        self.load_whole_state(model, optimizer, weights, optim)

    def optimizer_names(self, module: nn.Module, optimizer) -> list[list[str]] | None:
        """The name of every parameter of each of ``optimizer``'s groups (``None`` without an
        optimizer)."""
        return parameter_names(module, optimizer) if optimizer is not None else None

    def load_whole_state(
        self, model: nn.Module, optimizer, weights: dict[str, torch.Tensor], optim: dict | None
    ) -> None:
        """Put a whole state (full weights, optimizer state keyed by parameter name or ``None``)
        into this run's model and optimizer: how any strategy's checkpoint enters this one (every
        rank calls it)."""
        self.load_model_state_dict(model, weights)
        if optim is not None:
            names = self.optimizer_names(self.unwrap(model), optimizer)
            # optimizer state comes only with an optimizer (read_whole_state)
            assert names is not None
            optimizer.load_state_dict(by_index(optim, names))

    @property
    @abc.abstractmethod
    def library_world_size(self) -> int:
        """World size as the strategy's own library sees it, asked of the library itself: the
        runtime compares it with the launcher's to catch ranks that silently train alone (Accelerate
        without ``cpu=True``)."""


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a possibly sharded one (FSDP2's DTensor gradient norm)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def tied_parameters(module: nn.Module) -> dict[str, str]:
    """``{alias: first name}`` for every parameter registered under more than one name (tied
    weights)."""
    first: dict[int, str] = {}
    aliases = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if id(param) in first:
            aliases[name] = first[id(param)]
        else:
            first[id(param)] = name
    return aliases


def retie(state: dict[str, torch.Tensor], module: nn.Module) -> dict[str, torch.Tensor]:
    """Make each tied parameter's keys in a full state dict one tensor again (``{}`` stays
    ``{}``)."""
    for alias, name in tied_parameters(module).items():
        if alias in state and name in state:
            state[alias] = state[name]
    return state


Handle = TypeVar("Handle")


def ready(handle: Handle | None, what: str, made_by: str = "rankwise.setup()") -> Handle:
    """A library handle the strategy holds while its Runtime is open (Horovod and the Accelerator
    from ``rankwise.setup()``, the DeepSpeed engine from ``rt.prepare``); used outside that span is
    an error that says so, not an ``AttributeError`` on ``None``."""
    if handle is None:
        raise RuntimeError(
            f"{what} is not set up: {made_by} makes it and closing the Runtime releases it"
        )
    return handle
