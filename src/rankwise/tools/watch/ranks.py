"""What every part of the watcher needs: this rank, the ranks' values gathered, tensors whole,
patching, call sites."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from rankwise.compat.watch_patches import checked
from rankwise.launch.failures import RANKWISE_DIR

_all_gather_object = dist.all_gather_object
"""The watcher's own collective, kept from before it patches torch.distributed (its calls are not
the script's)."""


T = TypeVar("T")

ReplacementMaker = Callable[[Callable[..., Any]], Callable[..., Any]]
"""What :func:`patch` takes: the original (a library's function, any signature) -> what replaces
it."""


def patch(owner: type | ModuleType, name: str, make: ReplacementMaker) -> None:
    """Replace ``owner.name`` by ``make(original)``, keeping the original's name and docstring: only
    what :mod:`rankwise.compat.watch_patches` records (its version checked there)."""
    checked(owner, name)
    original = getattr(owner, name)
    setattr(owner, name, functools.wraps(original)(make(original)))


def _horovod() -> ModuleType | None:
    """Horovod's torch module where the script started Horovod (it opens no torch process group),
    else None."""
    hvd = sys.modules.get("horovod.torch")
    return hvd if hvd is not None and hvd.is_initialized() else None


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    hvd = _horovod()
    if hvd is not None:
        return hvd.rank(), hvd.size()
    return int(os.environ.get("RANK", 0)), 1


def gather(value: T) -> list[T]:
    """Every rank's ``value`` (a collective: every rank calls it at the same point; over Horovod's
    own in a Horovod script)."""
    hvd = None if dist.is_available() and dist.is_initialized() else _horovod()
    if hvd is not None:
        return hvd.allgather_object(value) if hvd.size() > 1 else [value]
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    values: list[Any] = [None] * dist.get_world_size()  # (each filled by the collective)
    _all_gather_object(values, value)
    return values


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on the CPU in fp32 (a collective for a sharded DTensor or a ZeRO-3
    parameter)."""
    if partitioned(tensor):
        from deepspeed.utils import safe_get_full_fp32_param

        # (every rank gathers its partitions)
        return safe_get_full_fp32_param(tensor).detach().float().cpu()
    if hasattr(tensor, "full_tensor"):
        tensor = tensor.full_tensor()
    return tensor.detach().float().cpu()


def assign(target: torch.Tensor, whole: torch.Tensor) -> None:
    """Copy a whole tensor into ``target`` (a DTensor here is one process's: its one shard is the
    whole; so is a ZeRO-3 parameter's partition)."""
    if partitioned(target):
        _assign_partitioned(target, whole)
        return
    local = target.to_local() if hasattr(target, "to_local") else target
    with torch.no_grad():
        local.copy_(whole.reshape(local.shape).to(local.device, local.dtype))


def partitioned(parameter: torch.Tensor) -> bool:
    """A ZeRO-3 parameter: an empty placeholder outside its module's forward, its data in
    partitions."""
    return hasattr(parameter, "ds_id")


def _assign_partitioned(parameter: torch.Tensor, value: torch.Tensor) -> None:
    """Whole weights into a ZeRO-3 parameter of a one-process run (its one partition holds all of
    it): the partition its forward gathers from, and the fp32 master its next step updates."""
    from deepspeed.utils import safe_set_full_fp32_param

    # ignore[attr-defined] (twice): DeepSpeed ZeRO-3 gives its parameters ds_tensor and ds_shape
    flat, partition = value.reshape(-1), parameter.ds_tensor  # type: ignore[attr-defined]
    with torch.no_grad():
        partition.data[: flat.numel()].copy_(flat.to(partition.device, partition.dtype))
    safe_set_full_fp32_param(parameter, value.reshape(parameter.ds_shape).to(partition.device))  # type: ignore[attr-defined]


def outside_the_script(filename: str) -> bool:
    """Whether a frame's file is neither the script's nor a framework's: torch, rankwise itself,
    code without a file."""
    return "/torch/" in filename or filename.startswith((RANKWISE_DIR, "<"))


TOOLS_DIR = str(Path(RANKWISE_DIR) / "tools")
"""rankwise's tools, the watcher among them: never a framework's line."""
RUNTIME_FILE = str(Path(RANKWISE_DIR) / "runtime" / "__init__.py")
"""The Runtime's module, whose collectives a script calls."""
RUNTIME_COLLECTIVES = frozenset(
    {"all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object", "barrier"}
)
"""The Runtime's collectives a script calls itself (``rt.all_reduce(loss)``): the script's call, not
rankwise's."""


def call_site(via: bool = False) -> str:
    """The script's line that called into torch: the innermost frame outside torch, the frameworks
    and the watcher (with ``via``: and the framework's line that made the call, where a framework
    did: rankwise's own library, for a script on ``rankwise.setup()``, is one)."""
    frame: FrameType | None = sys._getframe(2)
    framework, entered = None, None
    while frame is not None:
        name = frame.f_code.co_filename
        ours = outside_the_script(name)
        if not ours and "site-packages" in name:
            framework = framework or f"{name.split('site-packages/')[-1]}:{frame.f_lineno}"
        elif name.startswith(RANKWISE_DIR) and not name.startswith(TOOLS_DIR):
            framework = (
                framework or f"rankwise/{Path(name).relative_to(RANKWISE_DIR)}:{frame.f_lineno}"
            )
            entered = (name, frame.f_code.co_name)  # where the script entered rankwise
        elif not ours:
            if (
                entered is not None
                and entered[0] == RUNTIME_FILE
                and entered[1] in RUNTIME_COLLECTIVES
            ):
                # the script's own rt.all_reduce: its call, as a dist.all_reduce would be
                framework = None
            site = f"{Path(name).name}:{frame.f_lineno}"
            return f"{site} (via {framework})" if via and framework else site
        frame = frame.f_back
    return f"? (via {framework})" if via and framework else "?"
