"""A script that starts its own distributed job, captured in this one process: the world it asks for
becomes one rank, and its data-parallel wrapper stands aside.

A plain torch script (PyTorch's DDP tutorial, a script started by torchrun or by ``mp.spawn``) calls
``init_process_group`` and wraps its model in ``DistributedDataParallel`` (or FSDP) before it
trains.  Neither can run on fake parameters (DDP broadcasts the weights when it wraps them), and
neither is what the plan needs: the plan evaluates every strategy itself, from the model as the
script builds it.  While :func:`one_rank` is active:

- ``init_process_group`` starts a one-process group (rank 0 of 1, gloo where CUDA is absent, on a
  free local port) whatever world size, rank or rendezvous the script passes; the script's
  ``DistributedSampler`` then gives this rank the whole dataset, as at world size 1;
- ``DistributedDataParallel`` and FSDP's wrapper class return a thin wrapper that forwards to the
  model and keeps ``.module`` and ``no_sync()``; ``fully_shard`` leaves the model's parameters
  whole, as they are at one rank (:class:`OneRankShards`);
- ``mp.spawn(fn, args, nprocs)`` calls ``fn(0, *args)`` here, once;
- torchrun's variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ...) describe that one rank.

Each is replaced wherever a module imported it (a framework imported before the capture holds its
own name for DDP), everything is put back afterwards, and a group the script started is destroyed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from rankwise.compat.plan_patches import checked

T = TypeVar("T")
Sharded = TypeVar("Sharded", nn.Module, list[nn.Module])


class StandAside(nn.Module):
    """What ``DistributedDataParallel(model)`` returns during a capture: the model, unchanged, as
    ``.module``, with the attributes of DDP's that frameworks read (Lightning's DDP strategy reads
    ``static_graph`` and ``_get_ddp_logging_data()`` at teardown, ``require_backward_grad_sync``
    around accumulation), each as a DDP at its defaults says."""

    static_graph = False
    find_unused_parameters = False

    def __init__(self, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.module = module
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True

    def _get_ddp_logging_data(self) -> dict[str, str | int | bool]:
        return {}

    def register_comm_hook(self, state: object, hook: Callable[..., Any]) -> None:
        pass

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        yield

    def join(self, *args: Any, **kwargs: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class OneRankShards:
    """What ``fully_shard(module)`` does during a capture: at one rank FSDP2's shard of each
    parameter is the whole parameter, so the module keeps its parameters and only looks sharded to
    the script that checks (PyTorch's FSDP2 example asserts ``isinstance(model, FSDPModule)`` and
    each parameter's ``placements``):

    - the module's class becomes ``FSDP<Class>``, a subclass of ``FSDPModule`` and of its own class,
      as ``fully_shard`` makes it, with every ``FSDPModule`` method (``unshard``, ``reshard``,
      ``set_*``) doing nothing, which is what each does at one rank with nothing to gather;
    - each parameter says ``placements == (Shard(0),)``, and ``to_local()`` and ``full_tensor()``
      give the parameter, as a one-rank DTensor's do.

    :meth:`undo` puts every class back and removes the attributes (the plan copies the model)."""

    def __init__(self) -> None:
        self.modules: list[tuple[nn.Module, type]] = []
        self.params: list[torch.Tensor] = []
        self.classes: dict[type, type] = {}

    def __call__(self, module: Sharded, *args: Any, **kwargs: Any) -> Sharded:
        from torch.distributed.tensor import Shard

        modules = module if isinstance(module, list | tuple) else [module]
        for one in modules:
            if not isinstance(one, self._mixin()):
                self.modules.append((one, type(one)))
                one.__class__ = self._class_for(type(one))
            for param in one.parameters():
                if "placements" not in param.__dict__:
                    # (a one-rank DTensor's attributes, on the parameter itself: a Tensor has none
                    # of them, and undo() pops them from its __dict__ again)
                    whole = _returns(param)
                    param.__dict__.update(placements=(Shard(0),), to_local=whole, full_tensor=whole)
                    self.params.append(param)
        return module

    @staticmethod
    def _mixin() -> type:
        return _one_rank_fsdp_module()

    def _class_for(self, cls: type) -> type:
        if cls not in self.classes:
            self.classes[cls] = type(f"FSDP{cls.__name__}", (self._mixin(), cls), {})
        return self.classes[cls]

    def undo(self) -> None:
        for module, cls in self.modules:
            module.__class__ = cls
        for param in self.params:
            for name in ("placements", "to_local", "full_tensor"):
                param.__dict__.pop(name, None)


def _returns(value: T) -> Callable[..., T]:
    return lambda *args, **kwargs: value


_MIXIN: list[type] = []


def _one_rank_fsdp_module() -> type:
    """``FSDPModule`` with each of its methods a no-op (built once, when a script first calls
    ``fully_shard``)."""
    if not _MIXIN:
        from torch.distributed.fsdp import FSDPModule

        def nothing(self: FSDPModule, *args: Any, **kwargs: Any) -> None:
            return None

        methods: dict[str, Any] = {
            name: nothing
            for name, value in vars(FSDPModule).items()
            if callable(value) and not name.startswith("_")
        }

        def _apply(self: FSDPModule, *args: Any, **kwargs: Any) -> Any:
            # (FSDPModule's re-registers its sharded parameters after the move: there are none)
            # (past FSDPModule in FSDP<Class>'s order comes the script's class, an nn.Module, which
            # mypy cannot see from FSDPModule alone)
            return super(FSDPModule, self)._apply(*args, **kwargs)  # type: ignore[misc]

        methods["_apply"] = _apply
        # (FSDP<Class>, this, FSDPModule, Class: FSDPModule.__new__ builds the class at index 3)
        methods["_orig_cls_mro_index"] = 3
        _MIXIN.append(type("OneRankFSDPModule", (FSDPModule,), methods))
    return _MIXIN[0]


def unwrapped(model: nn.Module) -> nn.Module:
    """The script's own model inside a :class:`StandAside`, or inside the engine
    ``deepspeed.initialize`` returned: the engine's forward calls its ``.module`` as DDP's does, and
    it holds the run's process groups, which the plan's copy of the model cannot take along."""
    engine = _deepspeed_engine()
    while isinstance(model, StandAside) or engine is not None and isinstance(model, engine):
        inner = model.module
        assert isinstance(inner, nn.Module)
        model = inner
    return model


def _deepspeed_engine() -> type | None:
    """``deepspeed.DeepSpeedEngine`` where the script imported DeepSpeed (never imported here)."""
    deepspeed = sys.modules.get("deepspeed")
    return getattr(deepspeed, "DeepSpeedEngine", None) if deepspeed is not None else None


def _destroy_world() -> None:
    """End the script's one-rank group.  Where the script started DeepSpeed on it, through
    DeepSpeed: its groups module keeps the groups it made (its world's clone), which a later
    ``deepspeed.initialize`` in this process (the plan timing ZeRO's step) would use after torch
    destroyed them."""
    deepspeed = sys.modules.get("deepspeed")
    if deepspeed is not None and deepspeed.comm.is_initialized():
        deepspeed.comm.destroy_process_group()
    else:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bound_elsewhere(replacements: dict[int, Any]) -> list[tuple[Any, str, Any]]:
    """Every other name an imported module binds to one of the replaced objects (by ``id``), with
    its replacement: a framework imported before the capture holds its own reference
    (``from torch.nn.parallel import DistributedDataParallel`` in Lightning's DDP strategy), which
    replacing torch's attribute alone would miss."""
    found = []
    for module in list(sys.modules.values()):
        names = getattr(module, "__dict__", None)
        if not isinstance(names, dict):
            continue
        for name, value in list(names.items()):
            replacement = replacements.get(id(value))
            if replacement is not None and not name.startswith("__"):
                found.append((module, name, replacement))
    return found


ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@contextlib.contextmanager
def one_rank() -> Iterator[None]:
    """The script's distributed job as one rank in this process (see the module's docstring)."""
    import torch.distributed.fsdp as fsdp_module
    import torch.nn.parallel as parallel
    import torch.nn.parallel.distributed as ddp_module

    port = _free_port()
    saved_env = {name: os.environ.get(name) for name in ENV}
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    init = dist.init_process_group
    started: list[bool] = []
    shards = OneRankShards()

    def init_process_group(backend: str | None = None, *args: Any, **kwargs: Any) -> None:
        if dist.is_initialized():
            return None
        if backend is None or "nccl" in str(backend) and not torch.cuda.is_available():
            backend = "gloo"
        kwargs = {k: v for k, v in kwargs.items() if k in ("timeout", "pg_options", "device_id")}
        init(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, **kwargs)
        started.append(True)

    def spawn_one(
        fn: Callable[..., object],
        args: tuple[Any, ...] = (),
        nprocs: int = 1,
        join: bool = True,
        daemon: bool = False,
        start_method: str = "spawn",
    ) -> None:
        fn(0, *args)

    patched: list[tuple[Any, str, Any]] = [
        (dist, "init_process_group", init_process_group),
        (dist.distributed_c10d, "init_process_group", init_process_group),
        (mp, "spawn", spawn_one),
        (parallel, "DistributedDataParallel", StandAside),
        (ddp_module, "DistributedDataParallel", StandAside),
        (fsdp_module, "FullyShardedDataParallel", StandAside),
        (fsdp_module, "fully_shard", shards),
    ]
    # (each replacement's record checked against the installed torch: compat/plan_patches.py)
    patched = [p for p in patched if hasattr(p[0], p[1]) and checked(p[0], p[1])]
    patched += _bound_elsewhere({id(getattr(owner, name)): value for owner, name, value in patched})
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    for owner, name, value in patched:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in originals:
            setattr(owner, name, value)
        shards.undo()
        if started and dist.is_initialized():
            _destroy_world()
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
