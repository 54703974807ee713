"""A stand-in for a CUDA build on a CPU-only one, for rankwise plan's capture: what ``.to("cuda")``
and ``.cuda()`` return for a fake tensor there (a fake tensor of the same shape on ``cuda:0``, which
a CPU-only build refuses to make from ``.to``: "PyTorch is not linked with support for cuda
devices", yet makes from a factory), so a script that moves its model to the GPU is captured here
as it is on a GPU machine.  Real tensors (the script's batch) stay on the CPU, where a CPU build can
hold them; the capture stops before any computation."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from rankwise.tools.plan.fake import is_fake


def _target(args, kwargs) -> tuple[torch.device | None, torch.dtype | None]:
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    for arg in args:
        if isinstance(arg, torch.dtype):
            dtype = arg
        elif isinstance(arg, (str, torch.device)) or type(arg) is int:  # (not non_blocking)
            device = arg
        elif isinstance(arg, torch.Tensor):
            device, dtype = arg.device, arg.dtype
    if isinstance(device, int):
        device = f"cuda:{device}"
    return (None if device is None else torch.device(device)), dtype


def _on_cuda(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    with tensor.fake_mode:
        return torch.empty_like(tensor, device="cuda:0", dtype=dtype or tensor.dtype)


@contextlib.contextmanager
def fake_cuda() -> Iterator[None]:
    """While active: a fake tensor moved to ``cuda`` becomes a fake CUDA tensor (see the module's
    docstring)."""
    to, cuda = torch.Tensor.to, torch.Tensor.cuda

    def moved(tensor, *args, **kwargs):
        device, dtype = _target(args, kwargs)
        if device is not None and device.type == "cuda":
            if not is_fake(tensor):
                return to(tensor, dtype) if dtype is not None else tensor
            return _on_cuda(tensor, dtype)
        return to(tensor, *args, **kwargs)

    def to_cuda(tensor, device=None, non_blocking=False, **kwargs):
        return _on_cuda(tensor, None) if is_fake(tensor) else tensor

    torch.Tensor.to, torch.Tensor.cuda = moved, to_cuda  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.cuda = to, cuda  # type: ignore[method-assign]
