"""torch: fake tensors (the private ``torch._subclasses.fake_tensor``, what ``torch.compile`` traces
with), and what ``rankwise plan`` replaces in ``nn.Module`` to build a script's model on them.

``rankwise plan`` (``rankwise.tools.plan.fake``, ``.capture``) replaces two attributes of
``nn.Module`` and ``Tensor.item`` while it runs a script up to its first training forward
(:data:`PATCHES`): ``register_parameter``, so every
parameter a module registers is fake (shapes and no memory), and ``_apply``, what ``.to()``,
``.cuda()``, ``.half()`` and ``.float()`` go through.  torch's own ``_apply`` keeps each parameter
object through a device or dtype move (``param.data = converted``, unless
``torch.__future__.get_overwrite_module_params_on_conversion()``), so an optimizer built before the
move still steps the model's parameters; but for a fake parameter it swaps instead
(``torch.utils.swap_tensors``: ``isinstance(param, FakeTensor)``, torch 2.13's
``torch/nn/modules/module.py``), and the swap refuses a tensor with a weak reference, which every
fake tensor has (its mode's memo).  :func:`move_in_place` does what ``_apply`` does for a real
parameter: the same object, the converted tensor's storage, dtype, device and dispatch keys
(``set_data``), and the device a fake tensor reports, which it keeps in a Python attribute
(``FakeTensor.fake_device``) that ``set_data`` does not reach.

``tests/compat/test_fake_tensor.py`` shows on the installed torch that torch's own ``_apply`` still
refuses a fake parameter, and that :func:`move_in_place` keeps the object with the new dtype and
device.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor, FakeTensorMode

from rankwise.compat.versions import Patch, Private

SEEN_ON = ("2.13",)
"""torch release series it was checked on."""

REGISTER_PARAMETER = Patch(
    "torch.nn.Module.register_parameter",
    "torch",
    "every parameter a module registers becomes a fake tensor: a model of any size is built "
    "without its memory; no public API makes a module's parameters fake from their creation",
    SEEN_ON,
)
APPLY = Patch(
    "torch.nn.Module._apply",
    "torch",
    "a fake parameter keeps its object through .to() / .cuda() / .half() (move_in_place), as torch "
    "keeps a real one; torch's own swaps a fake one and the swap refuses its weak reference",
    SEEN_ON,
)
ITEM = Patch(
    "torch.Tensor.item",
    "torch",
    "a fake tensor's .item() before the script's first training step (an evaluation first, as "
    "nanoGPT's estimate_loss) reads 0 instead of raising: the capture needs the script to go on, "
    "not the value; a fake tensor has none",
    SEEN_ON,
)
PATCHES = (REGISTER_PARAMETER, APPLY, ITEM)
"""What ``rankwise plan`` replaces in torch while it captures a script."""


LOCAL_SCALAR = Private(
    "torch.ops.aten._local_scalar_dense",
    "torch",
    "the op every read of a tensor's value (.item(), bool(), int()) dispatches to: a fake tensor "
    "raises there, and the plan answers the read",
    SEEN_ON,
)
READ = torch.ops.aten._local_scalar_dense.default
"""The op every value read goes through (``item``, ``bool(tensor)``, ``torch.equal``): a fake tensor
raises :class:`DataDependentOutputException` there (it has no values)."""


def is_fake(tensor) -> bool:
    return isinstance(tensor, FakeTensor)


def move_in_place(param: torch.Tensor, converted: torch.Tensor) -> None:
    """Give the fake tensor ``param`` the shape, dtype and device of ``converted`` (a fake tensor of
    the same mode: what ``fn(param)`` returned in ``Module._apply``), keeping the object, as torch's
    ``_apply`` does for a real parameter (see the module's docstring)."""
    if not (isinstance(param, FakeTensor) and isinstance(converted, FakeTensor)):
        with torch.no_grad():
            param.data = converted
        return
    if param.device.type == "meta" and converted.device.type != "meta":
        # (materialised from the meta device, ``to_empty``: torch's set_data refuses a meta
        # tensor's dispatch keys for another device's; a fake tensor's operations go through its
        # mode, which reads the device it reports)
        if converted.dtype != param.dtype or converted.shape != param.shape:
            raise TypeError(
                f"cannot move a fake parameter off the meta device and change its dtype or shape "
                f"at once ({param.dtype} {tuple(param.shape)} -> {converted.dtype} "
                f"{tuple(converted.shape)})"
            )
        param.fake_device = converted.fake_device
        return
    with torch.no_grad():
        # (set_data: the storage, sizes, dtype and dispatch keys; a leaf stays a leaf)
        param.data = converted
    param.fake_device = converted.fake_device


__all__ = [
    "PATCHES",
    "READ",
    "SEEN_ON",
    "DataDependentOutputException",
    "FakeTensor",
    "FakeTensorMode",
    "is_fake",
    "move_in_place",
]
