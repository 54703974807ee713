"""Models whose parameters have shapes and no storage: fake tensors from the moment a module
registers them.

``FakeTensorMode`` (torch's own, what ``torch.compile`` traces with) gives tensors a shape, dtype
and device and no memory; an operation on them computes only the output's shape.
:func:`fake_parameters` turns every ``nn.Parameter`` a module registers while it is active into such
a tensor, so building an 8B-parameter model allocates nothing (``nn.Linear`` creates its weight with
``torch.empty``, which reserves pages it never touches, and the registration drops it at once).  Its
initialisation (``reset_parameters``, transformers' ``_init_weights``) then runs on the fake tensor
and costs nothing.  Buffers stay real: they are small (position ids, rotary frequencies), and a
forward pass reads their values (masks, lengths).

A module's ``.to(device, dtype)`` / ``.cuda()`` / ``.half()`` keeps each parameter object, as
torch's own ``Module._apply`` keeps a real one, so an optimizer built before the move (``opt =
AdamW(model.parameters()); model.to(device, dtype=torch.bfloat16)``; ``rt.prepare`` moving the model
to the GPU) still steps the model's parameters.  torch's ``_apply`` would swap each fake parameter
for a new one, which torch refuses for tensors with weak references (every fake tensor has one):
while :class:`FakeParameters` is active a module whose parameters are fake moves each in place
(:func:`rankwise.compat.fake_tensor.move_in_place`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import overload

import torch
from torch import nn

from rankwise.compat.fake_tensor import (
    APPLY,
    REGISTER_PARAMETER,
    FakeTensorMode,
    is_fake,
    move_in_place,
)

__all__ = ["FakeParameters", "fake_copy", "fake_mode", "is_fake", "real_copy", "rebuilt_optimizer"]


def fake_mode() -> FakeTensorMode:
    """The mode one plan's fake tensors share (fake tensors of two modes cannot meet in one
    operation); real tensors (a script's batch) may enter its operations."""
    return FakeTensorMode(allow_non_fake_inputs=True)


class FakeParameters:
    """While active (``with``): parameters registered by any module are fake tensors of ``mode``."""

    def __init__(self, mode: FakeTensorMode) -> None:
        self.mode = mode
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> FakeParameters:
        register, apply = nn.Module.register_parameter, nn.Module._apply
        REGISTER_PARAMETER.check()
        APPLY.check()
        owner = self

        def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
            if param is not None and not is_fake(param):
                param = nn.Parameter(
                    owner.mode.from_tensor(param.detach()), requires_grad=param.requires_grad
                )
            register(module, name, param)

        def _apply(
            module: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
        ) -> nn.Module:
            if not any(is_fake(p) for p in module._parameters.values()):
                return apply(module, fn, recurse)
            if recurse:
                for child in module.children():
                    child._apply(fn)
            for param in module._parameters.values():
                if param is None:
                    continue
                with torch.no_grad():
                    converted = fn(param)
                # a real change (a cast, a device): the same object moved, as torch keeps a real one
                if converted is not param:
                    move_in_place(param, converted)
                if param.grad is not None:
                    with torch.no_grad():
                        grad = fn(param.grad)
                    if grad is not param.grad:
                        move_in_place(param.grad, grad)
            for key, buffer in module._buffers.items():
                if buffer is not None:
                    module._buffers[key] = fn(buffer)
            return module

        # ignore[method-assign, assignment]: patching these two methods while the context is open is
        # the point
        nn.Module.register_parameter = register_parameter  # type: ignore[method-assign, assignment]
        nn.Module._apply = _apply  # type: ignore[method-assign]
        self._stack.callback(setattr, nn.Module, "register_parameter", register)
        self._stack.callback(setattr, nn.Module, "_apply", apply)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


@overload
def fake_copy(
    model: nn.Module, optimizer: torch.optim.Optimizer, dtype: torch.dtype | None = None
) -> tuple[nn.Module, torch.optim.Optimizer]: ...


@overload
def fake_copy(
    model: nn.Module, optimizer: None = None, dtype: torch.dtype | None = None
) -> tuple[nn.Module, None]: ...


def fake_copy(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[nn.Module, torch.optim.Optimizer | None]:
    """A copy of a model with fake parameters (cast to ``dtype`` when given; buffers copied), and a
    fresh optimizer of the same class and parameter groups over the copy's parameters (``None``
    without one): what a strategy may wrap and shard in place while the captured model stays as it
    was."""
    memo: dict[int, nn.Parameter] = {}
    for p in model.parameters():
        if id(p) not in memo:
            copied = (
                p.detach().to(dtype)
                if dtype is not None and p.is_floating_point()
                else p.detach().clone()
            )
            memo[id(p)] = nn.Parameter(copied, requires_grad=p.requires_grad)
    mapping = dict(memo)
    model_copy = copy.deepcopy(model, memo)
    if optimizer is None:
        return model_copy, None
    return model_copy, rebuilt_optimizer(optimizer, mapping, traceable_class(optimizer))


NATIVE_ADAM = {
    ("deepspeed.ops.adam.fused_adam", "FusedAdam"),
    ("deepspeed.ops.adam.cpu_adam", "DeepSpeedCPUAdam"),
    ("apex.optimizers.fused_adam", "FusedAdam"),
}
"""Adam optimizers whose step runs a compiled kernel on the tensors' memory (DeepSpeed's, Apex's):
given fake tensors, which have none, the kernel crashes the process (DeepSpeed's FusedAdam
segfaults).  Their state is torch's Adam's, two moments per element."""


def traceable_class(optimizer: torch.optim.Optimizer) -> type[torch.optim.Optimizer]:
    """The class that steps ``optimizer``'s parameters on fake tensors: its own, or for a native
    Adam (:data:`NATIVE_ADAM`) torch's ``AdamW`` (``adam_w_mode``, their default) or ``Adam``, which
    keep the same state."""
    kind = type(optimizer)
    if (kind.__module__, kind.__qualname__) not in NATIVE_ADAM:
        return kind
    return torch.optim.AdamW if getattr(optimizer, "adam_w_mode", True) else torch.optim.Adam


def rebuilt_optimizer(
    optimizer: torch.optim.Optimizer,
    mapping: dict[int, nn.Parameter],
    cls: type[torch.optim.Optimizer] | None = None,
) -> torch.optim.Optimizer:
    """A fresh optimizer of ``optimizer``'s class (or ``cls``) with its parameter groups and
    settings, over the parameters ``mapping`` gives for each of its parameters (by ``id``)."""
    cls = cls or type(optimizer)
    groups = []
    for group in optimizer.param_groups:
        settings = {key: value for key, value in group.items() if key != "params"}
        groups.append({**settings, "params": [mapping[id(p)] for p in group["params"]]})
    try:
        # ignore[call-arg]: torch.optim.Optimizer's own __init__ takes defaults; its subclasses'
        # take the groups alone
        return cls(groups)  # type: ignore[call-arg]  # every group carries all its settings
    except TypeError:  # an optimizer whose constructor insists on a setting by keyword
        return cls(groups, **optimizer.defaults)


def real_copy(
    model: nn.Module, optimizer: torch.optim.Optimizer, std: float = 0.02
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A copy of a fake-parameter model with real parameters (normal, ``std``) and its optimizer
    rebuilt over them: what times a real step on this machine where the model fits."""
    memo: dict[int, nn.Parameter] = {}
    for p in model.parameters():
        if id(p) not in memo:
            real = torch.empty(p.shape, dtype=p.dtype, device="cpu")
            with torch.no_grad():
                real.normal_(0.0, std) if real.is_floating_point() else real.zero_()
            memo[id(p)] = nn.Parameter(real, requires_grad=p.requires_grad)
    copied = copy.deepcopy(model, dict(memo))
    # (a native Adam as torch's: the step is timed through the Runtime, whose zero_grad(set_to_none)
    # DeepSpeed's FusedAdam does not take)
    return copied, rebuilt_optimizer(optimizer, memo, traceable_class(optimizer))
