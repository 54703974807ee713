"""``deepspeed``: ``deepspeed.initialize`` with a generated config; rankwise keeps the loop.

ZeRO stage 0-3 (``--set deepspeed.zero_stage=N``, or the variants ``deepspeed-zero0`` ..
``deepspeed-zero3``), optional CPU offload, optional user JSON merged on top.  Gradient accumulation
is DeepSpeed's own (``gradient_accumulation_steps``, boundaries set by ``no_sync``); precision maps
onto its ``bf16`` / ``fp16`` sections instead of autocast.  Clipping happens only when the loop asks
(``rt.step(..., max_norm=...)``): under ZeRO, DeepSpeed clips inside its optimizer step, which then
returns the norm DeepSpeed computed.  Runs under the torchrun-style launcher: no ``deepspeed``
launcher needed.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from typing_extensions import override

from rankwise import process
from rankwise.checkpoint import loading
from rankwise.checkpoint.atomic_files import cpu_copies
from rankwise.checkpoint.convert import by_index, parameter_names
from rankwise.checkpoint.deepspeed_format import (
    FOLDER,
    TAG,
    gathered_buckets,
    load_whole_optimizer,
    partitions_fit,
    read_whole,
)
from rankwise.compat.deepspeed_zero import (
    alias_fp32_masters,
    clipping_for_one_step,
    skip_shm_comm_build,
)
from rankwise.compat.torch_compile import compile_forward
from rankwise.errors import ConfigError
from rankwise.precision import Precision
from rankwise.process import backend_for
from rankwise.strategies import register, register_variant
from rankwise.strategies.base import LoopFacts, Strategy, ready, retie
from rankwise.strategies.deepspeed_config import generated_config, read_user_config
from rankwise.strategies.deepspeed_stages import STAGE_FACTS
from rankwise.strategies.options import DeepSpeedOptions, Options

INSTALL = "pip install 'rankwise[deepspeed]'"

Engine = Any
"""The ``deepspeed.DeepSpeedEngine`` :meth:`DeepSpeedStrategy.wrap` returns, which the loop then
passes back as its model (deepspeed ships no type information)."""


def import_deepspeed():
    try:
        import deepspeed
    except ImportError as e:
        raise ImportError(f"strategy deepspeed needs DeepSpeed: {INSTALL}  ({e})") from None
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    return deepspeed


def cast_floating_inputs(dtype: torch.dtype):
    """A forward pre-hook (``with_kwargs=True``) casting floating-point tensor inputs to
    ``dtype``."""

    def cast(value):
        return (
            value.to(dtype)
            if isinstance(value, torch.Tensor) and value.is_floating_point()
            else value
        )

    def hook(module, args, kwargs):
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    return hook


def fp32_cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    return (tensor.float() if tensor.is_floating_point() else tensor).cpu().clone()


class EnginePrecision(Precision):
    """DeepSpeed's precision: the engine casts the model (its ``bf16`` / ``fp16`` sections) and
    keeps its loss scaler in its own checkpoint, so there is no autocast and no scaler of
    rankwise's."""

    def __init__(self, name: str, device: torch.device):
        super().__init__(name, device)
        self.scaler = None

    @override
    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # autocast would be a second, conflicting cast


@register
class DeepSpeed(Strategy):
    name = "deepspeed"
    description = "DeepSpeed ZeRO stage 0-3 (--set deepspeed.zero_stage=N), rankwise's loop"
    whole_state = False  # each rank saves its own shard
    # DeepSpeed's universal conversion regroups the partitions for any world size (load_state)
    reshards = True
    requires = ("deepspeed",)
    install = INSTALL
    options_section = "deepspeed"
    options_cls = DeepSpeedOptions
    options: DeepSpeedOptions

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.engine = None
        # inside rt.step; rt.backward calls since the last step
        self._stepping, self._backwards = False, 0
        self.group_names: list[list[str]] = []

    @override
    def make_precision(self, name: str) -> Precision:
        return EnginePrecision(name, self.device)

    @classmethod
    @override
    def check_options(cls, options: Options | None) -> None:
        # resolve_options builds this strategy's own type
        assert isinstance(options, DeepSpeedOptions)
        if options.offload_param and options.zero_stage != 3:
            raise ConfigError("deepspeed.offload_param needs deepspeed.zero_stage=3")
        if options.config_file:
            read_user_config(options)

    def ds_config(self, facts: LoopFacts) -> dict:
        """The DeepSpeed config this run passes to ``deepspeed.initialize``."""
        self.check_options(self.options)
        return generated_config(self.options, facts, self.env.world_size, self.precision.dtype)

    @property
    @override
    def gathers_layers(self) -> bool:
        return self.options.zero_stage == 3  # ZeRO-3 gathers each module's partitioned parameters

    @override
    def setup_environment(self) -> None:
        deepspeed = import_deepspeed()
        # DeepSpeed reads its device from LOCAL_RANK, which only launchers set: a one-process
        # run (no launcher) gets it here.
        os.environ.setdefault("LOCAL_RANK", str(self.env.local_rank))
        super().setup_environment()
        if self.device.type == "cpu":
            # a kernel only inference uses, JIT-compiled for minutes otherwise
            skip_shm_comm_build()
        # DeepSpeed's communication layer attaches to the process group created above.
        deepspeed.init_distributed(
            dist_backend=backend_for(self.device),
            auto_mpi_discovery=False,
            timeout=datetime.timedelta(seconds=self.timeout_s),
        )

    @override
    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer | None):
        deepspeed = import_deepspeed()
        if optimizer is None:
            raise ValueError("strategy deepspeed needs the optimizer in prepare(model, optimizer)")
        # ZeRO-3 empties the optimizer's groups: keep their parameters' names for converting whole
        # state.
        self.group_names = parameter_names(model, optimizer)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model.to(self.device),
            optimizer=optimizer,
            config=self.ds_config(self.facts),
            dist_init_required=False,
        )
        alias_fp32_masters(self.engine.optimizer)  # fp32 ZeRO-3: no second copy of the partition
        if self.precision.dtype != torch.float32:
            # DeepSpeed casts the weights to bf16/fp16 but not keyword inputs: float features would
            # meet half-precision layers.  (Token ids and masks are integers and pass unchanged.)
            self.engine.module.register_forward_pre_hook(
                cast_floating_inputs(self.precision.dtype), with_kwargs=True
            )
        # The client optimizer keeps the param groups DeepSpeed's wrapper steps with, so
        # learning-rate schedulers and zero_grad on it work as in any other strategy; its step, only
        # in rt.step.
        if optimizer is not None:
            optimizer.register_step_pre_hook(self._refuse_plain_step)
        return self.engine, optimizer

    def _refuse_plain_step(self, optimizer, args, kwargs) -> None:
        if not self._stepping:
            raise RuntimeError(
                "optimizer.step() changes nothing under deepspeed: ZeRO steps its own partitions "
                "of the weights, with the gradients its backward reduced into them. Call "
                "rt.step(optimizer, model) instead (and rt.backward(loss, model), rt.zero_grad)"
            )

    @override
    def compile(self, model: Engine) -> nn.Module:
        """DeepSpeed's own hook, ``engine.compile()`` (it records that the engine is compiled and
        keeps its ZeRO hooks in step), with the module compiled through a frame Dynamo traces
        (``compat.torch_compile``)."""
        model.compile()
        compile_forward(model.module)
        return model

    @override
    def unwrap(self, model: nn.Module) -> nn.Module:
        return getattr(model, "module", model)

    @contextlib.contextmanager
    @override
    def no_sync(self, model: Engine):
        # Why: marks the micro-batch as inside an accumulation window, so DeepSpeed defers
        # the gradient reduction (stages 0-1) and the optimizer step to the last one.
        model.set_gradient_accumulation_boundary(False)
        try:
            yield
        finally:
            model.set_gradient_accumulation_boundary(True)

    @override
    def backward(self, loss: torch.Tensor, model: Engine) -> None:
        # The loop already divided the loss by grad_accum: do not let DeepSpeed divide again.
        model.backward(loss, scale_wrt_gas=False)
        self._backwards += 1
        if not model.is_gradient_accumulation_boundary():
            model.step()  # advances DeepSpeed's micro-step count; no update inside the window

    @override
    def step(self, optimizer, model: Engine, max_norm: float | None = None):
        if not self._backwards:
            raise RuntimeError(
                "rt.step under deepspeed, but no backward pass of this step went through "
                "rt.backward(loss, model): DeepSpeed reduces the gradients into its partitions in "
                "its own backward, which loss.backward() skips. Call rt.backward(loss, model)"
            )
        self._stepping, self._backwards = True, 0
        try:
            return self._step(model, max_norm)
        finally:
            self._stepping = False

    def _step(self, model: Engine, max_norm: float | None):
        zero_optimizer = model.optimizer
        if not hasattr(zero_optimizer, "clip_grad"):
            # ZeRO stage 0 in fp32 steps the client optimizer directly: the averaged gradients sit
            # on the parameters, and torch clips them as in any other strategy.
            norm = None
            if max_norm is not None:
                norm = torch.nn.utils.clip_grad_norm_(model.module.parameters(), max_norm)
            model.step()
            return norm
        if max_norm is None:
            model.step()
            return None
        # Under ZeRO the gradients live in DeepSpeed's partitions, and its optimizer clips them
        # inside its step: take the step with this step's limit and return the norm it computed
        # (before clipping).
        with clipping_for_one_step(model, zero_optimizer, max_norm):
            model.step()
        return torch.tensor(float(model.get_global_grad_norm()))

    @property
    @override
    def shards_optimizer_state(self) -> bool:
        return self.options.zero_stage >= 1

    @override
    def gradient_scale(self) -> float:
        if self.precision.name != "16-mixed":
            return 1.0
        engine = ready(self.engine, "the DeepSpeed engine", "rt.prepare")
        return float(getattr(engine.optimizer, "cur_scale", 1.0))

    @override
    def full_gradients(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """ZeRO keeps the averaged gradients in its partitions: DeepSpeed assembles each (a
        collective, ZeRO 1-3)."""
        from deepspeed.utils import safe_get_full_grad

        pairs = [
            (name, safe_get_full_grad(param))
            for name, param in self.unwrap(model).named_parameters()
        ]
        # every rank took part in each gather; rank 0 keeps the copies
        scale = self.gradient_scale()
        return {
            name: g.detach().float().cpu() / scale
            for name, g in pairs
            if g is not None and self.env.is_main
        }

    @override
    def zero_grad(self, optimizer) -> None:
        # engine.step() already zeroed DeepSpeed's gradients.  The client optimizer now holds the
        # fp32 partitions, and dropping their .grad would break CPU offload, which allocates it
        # once.
        return None

    @override
    def model_state_dict(self, model: Engine) -> dict[str, torch.Tensor]:
        """Full fp32 weights on the CPU; under ZeRO-3 gathered from every rank (a collective) and
        complete on rank 0 only, as with FSDP: other ranks get an empty dict."""
        module = self.unwrap(model)
        if self.options.zero_stage != 3:
            return cpu_copies(module.state_dict(), fp32_cpu_copy)  # tied parameters stay one tensor
        if hasattr(model, "empty_partition_cache"):
            # Parameters prefetched for the next forward may still be in flight; the gathers below
            # re-partition each parameter on exit, which DeepSpeed refuses for one in flight.
            model.empty_partition_cache()
        # partitioned parameters are empty placeholders here
        state = module.state_dict(keep_vars=True)
        full: dict[int, torch.Tensor] = {}
        for chunk in gathered_buckets(state, self.options.bucket_size, modifier_rank=None):
            if self.env.is_main:  # only rank 0 keeps the copies
                full.update((id(p), fp32_cpu_copy(p)) for p in chunk)
        if not self.env.is_main:
            return {}
        return {k: full[id(v)] if id(v) in full else fp32_cpu_copy(v) for k, v in state.items()}

    @override
    def load_model_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load full weights (rank 0's are used under ZeRO-3: it re-partitions them to every
        rank)."""
        module = self.unwrap(model)
        if self.options.zero_stage != 3:
            module.load_state_dict(state)
            return
        current = module.state_dict(keep_vars=True)
        if current.keys() != state.keys():
            missing, unexpected = (
                sorted(current.keys() - state.keys()),
                sorted(state.keys() - current.keys()),
            )
            raise RuntimeError(
                f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        names: dict[int, str] = {}
        for key, value in current.items():
            if isinstance(value, nn.Parameter):
                names.setdefault(id(value), key)
            else:
                value.copy_(state[key])  # buffers are not partitioned
        # Rank 0 writes each gathered bucket; DeepSpeed re-partitions it to every rank on exit.
        for chunk in gathered_buckets(current, self.options.bucket_size, modifier_rank=0):
            if self.env.is_main:
                with torch.no_grad():
                    for param in chunk:
                        param.copy_(state[names[id(param)]])

    # -- its checkpoint format: each rank's ZeRO partition, by DeepSpeed into FOLDER/TAG -----------
    @classmethod
    @override
    def claims(cls, directory: Path) -> bool:
        return (directory / FOLDER / TAG).is_dir()

    @override
    def save_state(self, directory: Path, model: Engine, optimizer) -> None:
        # Every rank must call save_checkpoint: each writes its ZeRO partition.  It has barriers of
        # its own, so a rank that fails inside it cannot rejoin the others: the job stops, naming
        # the rank and path.
        from rankwise.checkpoint import CollectiveSaveError

        try:
            model.save_checkpoint(str(directory / FOLDER), tag=TAG, save_latest=False)
        except OSError as e:
            raise CollectiveSaveError(
                f"rank {self.env.rank}: cannot write {e.filename or directory}: {e.strerror or e}; "
                "DeepSpeed's save is collective, so the job stops here (the previous checkpoint "
                "is intact)"
            ) from e

    @classmethod
    @override
    def read_whole_state(cls, directory: Path, module: nn.Module, names: list[list[str]] | None):
        """The partitions regrouped whole; their fp32 master weights replace the saved (under
        16-bit, rounded) ones."""
        weights, _ = super().read_whole_state(directory, module, None)
        if names is None:
            return weights, None
        masters, optim = read_whole(directory, names)
        return retie({**weights, **masters}, module), optim

    @override
    def load_state(
        self, directory: Path, model: Engine, optimizer, writer: type[Strategy] | None = None
    ) -> None:
        """DeepSpeed's own load where its partitions fit this run (same world size, ZeRO layout);
        else the whole checkpoint (any world size or strategy) with this run's partitions cut from
        it, masters and moments alike."""
        if partitions_fit(directory / FOLDER / TAG, self.env.world_size, self.options.zero_stage):
            # it unpickles them fully
            loading.check_safe((directory / FOLDER).rglob("*.pt"), "DeepSpeed")
            path, _ = model.load_checkpoint(
                str(directory / FOLDER),
                tag=TAG,
                load_optimizer_states=True,
                load_lr_scheduler_states=False,
            )
            if path is None:
                raise RuntimeError(
                    f"rank {self.env.rank}: no DeepSpeed state under {directory / FOLDER}"
                )
            return
        if self.options.zero_stage == 0 and self.precision.dtype != torch.float32:
            # DeepSpeed's 16-bit stage 0 wraps the optimizer with fp32 master copies of its own.
            raise RuntimeError(
                f"rank {self.env.rank}: DeepSpeed ZeRO stage 0 at {self.precision.name} cannot "
                f"continue another strategy's or world size's checkpoint ({directory}); use ZeRO "
                "stage 1-3, or 32-true at stage 0"
            )
        super().load_state(directory, model, optimizer, writer)

    @override
    def optimizer_names(self, module: nn.Module, optimizer) -> list[list[str]] | None:
        # ZeRO-3 empties the optimizer's groups: the names kept at wrap time
        return self.group_names

    @override
    def load_whole_state(
        self, model: nn.Module, optimizer, weights: dict[str, torch.Tensor], optim: dict | None
    ) -> None:
        self.load_model_state_dict(model, weights)
        # no optimizer (the contract's None); wrap always keeps the group names, so unseen
        if optim is None:
            return
        if self.options.zero_stage == 0:  # the optimizer is whole: torch's own load
            optimizer.load_state_dict(by_index(optim, self.group_names))
        else:
            load_whole_optimizer(
                ready(self.engine, "the DeepSpeed engine", "rt.prepare").optimizer,
                self.unwrap(model),
                optimizer,
                weights,
                optim,
                self.device,
            )

    @property
    @override
    def library_world_size(self) -> int:
        import deepspeed.comm

        return deepspeed.comm.get_world_size()

    @override
    def teardown(self, clean: bool = True) -> None:
        # ZeRO-3 registers hooks and buffers that abort the process at exit (SIGABRT) if the
        # process group goes first: destroy the engine, then leave the group.
        if self.engine is not None:
            self.engine.destroy()
            self.engine = None
        import deepspeed.comm

        # DeepSpeed's own teardown also drops the groups it caches: a second run in this
        # process would otherwise broadcast over the destroyed ones.
        process.destroy_process_group(
            clean, deepspeed.comm.destroy_process_group if deepspeed.comm.is_initialized() else None
        )


for _stage in range(4):
    register_variant(
        f"deepspeed-zero{_stage}",
        "deepspeed",
        {"deepspeed.zero_stage": _stage},
        f"DeepSpeed at ZeRO stage {_stage}",
        STAGE_FACTS[_stage],
    )
